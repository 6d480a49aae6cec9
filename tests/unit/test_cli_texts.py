"""Texts a newcomer reads: each flag's default said once, the summary line as one clause, the
record's path in one form for `run` and `resume`, and what dp really does on CPU devices.
In-process: nothing here starts a run."""

from __future__ import annotations

import argparse
import io
import json

from gputui import cli
from gputui.cli.common import HelpFormatter
from gputui.cli.printer import Printer
from gputui.core.runstore import RunSummary
from test_cli_help import _parsers


def test_every_flag_says_its_default_once(capsys):
    for path, parser in _parsers(cli.build_parser()):
        formatter = HelpFormatter(path)
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            text = formatter._expand_help(action)
            assert text.count("(default") <= 1, f"{path} {action.option_strings}: {text}"
    try:
        cli.main(["sweep", "--help"])
    except SystemExit:
        pass
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: auto)" in text and "(default) (default" not in text


def _summary(run_dir: str = "", **fields) -> list[str]:
    out = io.StringIO()
    Printer(stream=out, live=False, quiet=True).summary(
        RunSummary.from_dict({"run_id": "x", **fields}), run_dir=run_dir)
    return out.getvalue().splitlines()


def test_the_summary_line_reads_as_one_clause():
    line = _summary(status="stopped", reason="stopped by SIGINT (Ctrl-C)", init_s=7.11)[0]
    assert line == "summary: status stopped by SIGINT (Ctrl-C), init 7.11 s"
    assert _summary(status="failed", reason="diverged at step 12", init_s=1.0)[0] == \
        "summary: status failed: diverged at step 12, init 1.00 s"
    assert _summary(status="finished", init_s=2.0)[0] == "summary: status finished, init 2.00 s"


def test_the_record_path_has_one_form_for_run_and_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    # `run` hands the printer runs/<id>; `resume` the folder it resolved (absolute)
    assert _summary(status="finished", run_dir="runs/r1")[-1] == "record: runs/r1"
    assert _summary(status="finished", run_dir=str(tmp_path / "runs" / "r1"))[-1] == \
        "record: runs/r1"
    elsewhere = tmp_path.parent / "elsewhere"
    assert _summary(status="finished", run_dir=str(elsewhere))[-1] == f"record: {elsewhere}"


def test_strategies_say_dp_runs_unreplicated_on_cpu_devices(capsys):
    assert cli.main(["strategies", "--devices", "cpu*2", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["strategies"]}
    assert rows["dp"]["available"] and "unreplicated" in rows["dp"]["caveat"]
    assert "cpu:1 idle" in rows["dp"]["caveat"] and rows["scratch"]["caveat"] == ""
    assert cli.main(["strategies", "--devices", "cpu*2"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "yes, runs unreplicated" in text
