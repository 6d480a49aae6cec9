"""Help and wording: every command and flag documented (defaults shown), presets listed with
their whole descriptions, plurals right. In-process: nothing here starts a run."""

from __future__ import annotations

import argparse

import pytest

from gputui import cli
from gputui.core.events import acc_text, plural
from gputui.core.presets import list_presets, preset_description
from run_records import write_record


def _parsers(parser: argparse.ArgumentParser, path: str = "gputui"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {c.dest for c in action._choices_actions if c.help}
            for name, sub in action.choices.items():
                assert name in helped, f"`{path} {name}` has no help line in `{path} --help`"
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_and_flag_has_help():
    for path, parser in _parsers(cli.build_parser()):
        assert parser.description, f"`{path} --help` has no description"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                   argparse._SubParsersAction)):
                continue
            assert action.help, f"{path} {action.option_strings or action.dest}: no help text"


def test_defaults_are_shown_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench-comm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: cpu*2)", "(default: 4K,64K,1M,4M)", "(default: 20)",
                  "(default: 3)", "(default: scratch,torch)", "(default: auto)"):
        assert shown in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_presets_lists_each_whole_description(capsys):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    for path in list_presets():
        lines = preset_description(path)
        assert len(lines) >= 2, f"{path.name}: say what it runs and where, in its header"
        for line in lines:
            assert line.strip() in out


def test_plurals_and_accuracy_units():
    assert [plural(n, "epoch") for n in (0, 1, 2)] == ["0 epochs", "1 epoch", "2 epochs"]
    assert acc_text(0.95123) == "95.12%"


def test_resume_of_a_finished_one_epoch_run_says_epoch(tmp_path, capsys):
    run = write_record(tmp_path / "runs", "20260101-100000-exp", epochs=1)
    (run / "checkpoint.pt").write_bytes(b"")
    assert cli.main(["resume", str(run)]) == 2
    assert capsys.readouterr().err == ("gputui: error: 20260101-100000-exp already finished its "
                                       "1 epoch; pass --epochs N with N > 1 to train it "
                                       "further\n")
