"""Bad input everywhere gets one clear line and exit status 2, never a traceback: presets
(absurd values, path tricks, missing data, non-text files), CLI flags, `gputui resume`, and
corrupt or truncated run records, which are still listed. Presets are data only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gputui import cli
from gputui.core import registry, runstore
from gputui.core.config import ConfigError, load_preset
from gputui.runs.prepare import load_checked

PACKAGE = Path(cli.__file__).resolve().parents[1]


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """``gputui ARGV`` in this process: (exit status, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    return code, capsys.readouterr().err


def preset(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,error", [
    ("[optim]\nlr = nan\n", "optim.lr must be a finite number, got nan"),
    ("[optim]\nlr = inf\n", "optim.lr must be a finite number, got inf"),
    ("[model]\ninit_std = nan\n", "model.init_std must be a finite number, got nan"),
    ("[run]\nepochs = 1000000000\n", "run.epochs must be at most 100000, got 1000000000"),
    ("[run]\nseed = 99999999999999999999\n", "run.seed must be at most 4294967295"),
    ("[run]\nseed = -1\n", "run.seed must be at least 0, got -1"),
    ("[optim]\nbatch_size = 0\n", "optim.batch_size must be at least 1, got 0"),
    ("[run]\non_divergence = \"ignore\"\n", "run.on_divergence must be one of stop, continue"),
    ("[run]\ncheckpoint_every = -5\n", "run.checkpoint_every must be at least 0, got -5"),
    ("[run]\nname = \"../../etc\"\n", "run.name '../../etc' looks like a path"),
    ("[run]\nname = \"/tmp/x\"\n", "run.name '/tmp/x' looks like a path"),
    ("[run]\nname = \"..\"\n", "run.name '..' looks like a path"),
    ("[run]\nname = \"a\\\\..\\\\b\"\n", "looks like a path"),
    ("[run]\nname = \"~root\"\n", "looks like a path"),
    ("[run]\nname = \"a\\nb\"\n", "looks like a path"),
    ("[model]\nname = \"os.system\"\n", "model.name must be one of lenet, resnet18, mlp, gpt"),
    ("[strategy]\nname = \"os.system\"\n", "strategy.name must be one of"),
    ("[strategy]\nname = \"../single\"\n", "strategy.name must be one of"),
    ("[data]\nname = \"__import__('os')\"\n", "data.name must be one of"),
])
def test_absurd_and_tricky_preset_values(tmp_path, text, error):
    path = preset(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_checked(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and error in message and "\n" not in message


def test_a_binary_preset_is_one_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_bytes(b"\xff\xfe\x00[run]\x00\x9c")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text"):
        load_preset(path)


def test_a_folder_given_as_preset_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read the preset"):
        load_preset(tmp_path)


@pytest.mark.parametrize("name", ["../../escape", "/etc/passwd", "..", "", "a\x00b", "~",
                                  "x" * 500, "ü-ß", "a/../../b"])
def test_new_run_dir_never_leaves_the_runs_folder(tmp_path, name):
    base = tmp_path / "runs"
    run_id, path = runstore.new_run_dir(base, name)
    assert path.parent == base and path.is_dir()
    assert path.resolve().parent == base.resolve() and "/" not in run_id
    assert len(run_id) < 80


def test_presets_are_data_only():
    """Nothing a preset holds reaches an import or an eval, except the factories the user names
    (model.factory, data.factory), imported by userfactory in the training process only: the
    other dynamic import is the strategies' loader (train/strategies/__init__.py), whose module
    names are the registry's fixed identifiers; every torch.load is weights_only."""
    hits = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in (r"import_module\(", r"__import__\(", r"(?<![\w.])eval\(",
                        r"(?<![\w.])exec\(", r"pickle\.loads?\(", r"runpy", r"importlib\.util"):
            if re.search(pattern, text):
                hits.append((path.relative_to(PACKAGE).as_posix(), pattern))
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{path}: {call}"
    assert sorted(hits) == [("train/strategies/__init__.py", r"import_module\("),
                            ("train/userfactory.py", r"import_module\("),
                            ("train/userfactory.py", r"importlib\.util")]
    # only the training side reaches userfactory (the CLI and the app never import user code)
    users = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                   if re.search(r"import .*userfactory|userfactory import",
                                p.read_text(encoding="utf-8")))
    assert all(u.startswith("train/") for u in users), users
    for info in registry.all_infos():
        assert info.module.isidentifier(), info.module
    assert registry.get("os.system") is None


@pytest.mark.parametrize("args,expected", [
    (("run", "quickstart", "--epochs", "-1"), "--epochs: run.epochs must be at least 1, got -1"),
    (("run", "quickstart", "--batch-size", "abc"),
     "argument --batch-size: invalid int value: 'abc'"),
    (("run", "quickstart", "--lr", "nan"), "--lr: optim.lr must be a finite number, got nan"),
    (("run", "quickstart", "--seed", "-3"), "--seed: run.seed must be at least 0, got -3"),
    (("run", "no-such-preset"), "no-such-preset: no such preset file or preset name"),
    (("run", "quickstart", "--set", "run.name=../../x"), "run.name '../../x' looks like a path"),
    (("run", "quickstart", "--set", "model.name=os.system"), "model.name must be one of"),
    (("run", "quickstart", "--set", "data.name=mnist", "--set", "data.root=/no/such/folder"),
     "/no/such/folder"),
    (("run", "quickstart", "--set", "run.resume_from=/no/such/run"),
     "run.resume_from: no checkpoint at /no/such/run"),
    (("resume", "no-such-run"), "no run 'no-such-run' under "),
    (("resume", "quickstart", "--epochs", "x"), "argument --epochs: invalid int value: 'x'"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, tmp_path, args, expected):
    code, err = run_cli(capsys, *args)
    assert code == 2, err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_resume_of_a_folder_without_checkpoint_or_config(capsys, tmp_path):
    folder = tmp_path / "runs" / "20260101-000000-x-abcd"
    folder.mkdir(parents=True)
    code, err = run_cli(capsys, "resume", str(folder))
    assert code == 2 and "no config.toml, so this is not a gputui run folder" in err
    (folder / "config.toml").write_text("[run]\nepochs = 2\n")
    code, err = run_cli(capsys, "resume", folder.name, "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and "no checkpoint (checkpoint.pt): the run ended before" in err
    assert err.count("\n") == 1


# ------------------------------------------------------------------ corrupt records
def _record(base: Path, name: str, lines: list[str], summary: str | None = None) -> Path:
    folder = base / name
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    if summary is not None:
        (folder / "summary.json").write_text(summary)
    return folder


STARTED = json.dumps({"type": "run_started", "t": 1.0, "run_id": "x", "config":
                      {"run": {"epochs": 2}}, "devices": [{"name": "cpu:0"}],
                      "strategy": "single"})
EPOCH = json.dumps({"type": "epoch_end", "t": 2.0, "epoch": 1, "epochs": 2, "seconds": 1.0,
                    "train_loss": 0.5, "test_acc": 0.9, "samples_per_s": 100.0})


def test_truncated_and_corrupt_records_are_still_listed(tmp_path):
    base = tmp_path / "runs"
    _record(base, "1-good", [STARTED, EPOCH, json.dumps({"type": "run_finished", "t": 3.0,
                                                         "seconds": 2.0})])
    torn = _record(base, "2-torn", [STARTED, EPOCH])
    with open(torn / "events.jsonl", "a") as fh:
        fh.write('{"type":"step","t":3.0,"epoch":1,"st')  # the writer died mid-line
    _record(base, "3-garbage", [STARTED, "\x00\x01 not json", "[1, 2]", "null", '"text"',
                                '{"type": "no_such_event"}', '{"type": "epoch_end"}', EPOCH],
            summary="{ broken json")
    _record(base, "4-wrong-shapes", [
        json.dumps({"type": "run_started", "t": 1.0, "run_id": "x", "config": 5,
                    "devices": "cpu", "strategy": "single"}),
        json.dumps({"type": "epoch_end", "t": 2.0, "epoch": "one", "epochs": 2, "seconds": "x",
                    "train_loss": None, "test_acc": "high", "samples_per_s": []})],
        summary="[]")
    (base / "5-empty").mkdir()
    (base / "5-empty" / "events.jsonl").write_bytes(b"")
    (base / "6-binary").mkdir()
    (base / "6-binary" / "events.jsonl").write_bytes(b"\xff\xfe\x00\x80" * 50)

    runs = dict((p.name, s) for p, s in runstore.list_runs(base))
    assert sorted(runs) == ["1-good", "2-torn", "3-garbage", "4-wrong-shapes", "5-empty",
                            "6-binary"]
    assert all(isinstance(s, runstore.RunSummary) for s in runs.values())
    assert runs["1-good"].status_text == "finished"
    assert runs["2-torn"].status_text == "running" and runs["2-torn"].epochs_done == 1
    assert runs["3-garbage"].epochs_done == 1 and runs["3-garbage"].test_acc == 0.9
    assert [e.kind for e in runstore.read_events(torn)] == ["run_started", "epoch_end"]
    assert runs["5-empty"].status_text == "running" and runs["6-binary"].epochs_done == 0
    assert runs["4-wrong-shapes"].status_text == "unreadable"
    assert runs["4-wrong-shapes"].reason.startswith("the record cannot be summarised")
