"""Faults, round three (issue 27): inputs refused where they are given, in one line, exit 2,
before anything starts. Run in process through ``gputui.cli.main`` (its exit status and its
stderr are the behaviour); nothing here trains."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch

from gputui.cli import main
from gputui.core import ckptfile
from gputui.core.config import load_preset
from gputui.core.errors import brief
from gputui.core.presets import PACKAGE_PRESETS
from gputui.runs.sweep import manifest_size
from gputui.runs.sweep.manifest_size import MANIFEST_LIMIT, MAX_POINTS, grid_problem
from gputui.runs.sweep.runner import Manifest, Point, load_manifest

CHECKPOINT = {"format": 1, "strategy": "single", "world_size": 1,
              "position": {"epoch": 1, "step": 3, "global_step": 3, "epoch_loss": 0.0,
                           "epoch_done": False},
              "state": {"w": torch.arange(4096, dtype=torch.float32)},
              "schedule": {"steps": 3}, "rng": {"torch": torch.get_rng_state()}}


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _checkpoint_bytes() -> bytes:
    buf = io.BytesIO()
    torch.save(CHECKPOINT, buf)
    return buf.getvalue()


def _stopped_run(tmp_path: Path, checkpoint: bytes) -> Path:
    """A run folder as a stop leaves it: its config, a summary, a checkpoint."""
    run = tmp_path / "runs" / "20260101-000000-tiny-abcd"
    run.mkdir(parents=True)
    cfg = load_preset(PACKAGE_PRESETS / "quickstart.toml").replace(
        run={"epochs": 1}, devices={"spec": "cpu"}, strategy={"name": "single"},
        data={"train_size": 512, "test_size": 256})
    (run / "config.toml").write_text(cfg.to_toml())
    (run / "summary.json").write_text(json.dumps({"status": "stopped", "epochs_done": 0,
                                                  "epochs": 1}))
    (run / "checkpoint.pt").write_bytes(checkpoint)
    return run


# ------------------------------------------------------------------ a damaged checkpoint

def test_a_whole_checkpoint_passes_and_damaged_ones_are_named(tmp_path):
    whole = _checkpoint_bytes()
    path = tmp_path / "c.pt"
    path.write_bytes(whole)
    assert ckptfile.problem(path) is None
    middle = len(whole) // 2
    flipped = bytearray(whole)
    flipped[middle] ^= 0xFF
    buf = io.BytesIO()
    torch.save({"weights": torch.ones(3)}, buf)  # a torch file, not a gputui checkpoint
    cases = {"cut short": whole[:5000], "cut short ": b"", "not a checkpoint": os.urandom(3000),
             "checksum": bytes(flipped), "lost or added": whole[:middle] + whole[middle + 7:],
             "not a gputui checkpoint": buf.getvalue()}
    for words, data in cases.items():
        path.write_bytes(data)
        problem = ckptfile.problem(path)
        assert problem and words.strip() in problem and "\n" not in problem, (words, problem)
    assert "a folder" in ckptfile.problem(tmp_path)
    # every checkpoint gputui wrote before, kept as fixtures, is whole
    for old in sorted((Path(__file__).parent / "data" / "checkpoints_v1").glob("*.pt")):
        assert ckptfile.problem(old) is None, old


def test_resume_refuses_a_truncated_checkpoint_before_anything_starts(tmp_path, capsys):
    run = _stopped_run(tmp_path, _checkpoint_bytes()[:5000])
    before = sorted(os.listdir(run.parent))
    assert main(["resume", str(run)]) == 2
    err = _error(capsys)
    assert str(run / "checkpoint.pt") in err and "cut short" in err
    assert err.endswith(f"`gputui run {run / 'config.toml'}`")  # whole, the fix at its end
    assert "--set" not in err and "preset" not in err  # the user typed neither
    assert sorted(os.listdir(run.parent)) == before  # no new run folder, no record


def test_a_resumed_runs_config_is_not_called_a_preset(tmp_path, capsys):
    run = _stopped_run(tmp_path, _checkpoint_bytes())
    (run / "config.toml").write_bytes(b"\xff\xfe[run]")
    assert main(["resume", str(run)]) == 2
    err = _error(capsys)
    assert "run config" in err and "preset" not in err


def test_brief_keeps_whole_sentences():
    text = "First part is fine. " + "word " * 80
    assert brief(text, 100) == "First part is fine."
    assert brief("short", 100) == "short"
    cut = brief("x " * 200, 50)
    assert cut.endswith(" ...") and len(cut) <= 50


# ------------------------------------------------------------------ limits where given

def test_the_point_bound_follows_from_the_size_the_manifest_is_read_at():
    assert MAX_POINTS * manifest_size.POINT_BYTES + manifest_size.HEADER_BYTES <= MANIFEST_LIMIT
    assert "--repeat 6000" in grid_problem(6000, ["1"], ["single"], {})
    assert grid_problem(MAX_POINTS, ["1"], ["single"], {}) is None
    assert grid_problem(MAX_POINTS // 4 + 1, ["1", "2"], ["single", "scratch"], {})


def test_the_docs_give_the_bound_the_code_has():
    docs = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
    assert f"at most {MAX_POINTS} runs" in docs.read_text()


def test_every_point_fits_its_share_so_the_fullest_sweep_is_read_back(tmp_path):
    reason = "RuntimeError: " + "a very long failure \u00e9 " * 400
    others = [{"pid": i, "name": "python" * 10, "mem": 1 << 30, "gpu": "GPU-" + "f" * 36}
              for i in range(6)]
    worst = Point("scratch", "64", "cpu*64", status="failed", run_id="x" * 60, reason=reason,
                  rep=MAX_POINTS, session=99, machine={"gpu_others": others, "note": "c" * 200},
                  settings={"run.precision": "bf16", "run.compile": "max-autotune-no-cudagraphs",
                            "run.channels_last": True})
    m = Manifest("s1", "/p.toml", ["run.name=" + "n" * 200], ["64"], ["scratch"],
                 points=[Point(**vars(worst)) for _ in range(50)], repeat=50)
    path = m.save(tmp_path)
    per_point = (path.stat().st_size - len(json.dumps(dict(vars(m), points=[]), indent=2))) / 50
    assert per_point <= manifest_size.POINT_BYTES  # so MAX_POINTS of them fit the limit
    back = load_manifest(tmp_path, "s1")
    assert len(back.points) == 50
    assert back.points[0].reason.startswith("RuntimeError: a very long failure")
    assert back.points[0].reason.endswith("holds it whole)")


def test_sweep_repeat_beyond_the_bound_is_refused_at_once(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["sweep", "quickstart", "--repeat", "6000", "--runs-dir", str(runs)]) == 2
    assert "--repeat 6000: 6000 passes over the grid of 4 points" in _error(capsys)
    assert main(["sweep", "quickstart", "--repeat", str(MAX_POINTS // 4 + 1), "--devices",
                 "1,2", "--strategies", "single,scratch", "--runs-dir", str(runs)]) == 2
    assert f"give --repeat {MAX_POINTS // 4} or less" in _error(capsys)
    assert main(["sweep", "quickstart", "--devices", "1,100000", "--runs-dir", str(runs)]) == 2
    assert "from 1 to 64" in _error(capsys)
    assert not runs.exists()  # no manifest, no run


# ------------------------------------------------------------------ predict's folders

def test_predict_checks_its_folders_before_measuring(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(blocker / "gputui"))
    assert main(["predict", "quickstart", "--devices", "1", "--runs-dir", str(runs)]) == 2
    out = capsys.readouterr()
    assert "measure cache" in out.err and "a file, not a folder" in out.err
    assert out.err.count("\n") == 1 and "measuring" not in out.out
    assert os.listdir(runs) == []  # nothing measured, so nothing lost
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["predict", "quickstart", "--runs-dir", str(blocker)]) == 2
    assert "--runs-dir" in _error(capsys)
    assert main(["sweep", "quickstart", "--predict", "--runs-dir", str(blocker)]) == 2
    assert "--runs-dir" in _error(capsys)


def test_sweep_predict_refuses_what_it_would_ignore(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["sweep", "quickstart", "--predict", "--repeat", "3"]) == 2
    assert "--repeat" in _error(capsys)
    assert main(["sweep", "quickstart", "--predict", "--strategies", "ddp,bogus"]) == 2
    assert "'bogus'" in _error(capsys)
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ a model that cannot be cut

USER_MODELS = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, c, classes):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c * 28 * 28, 8), nn.Linear(8, classes)

    def forward(self, x):
        return self.fc2(self.fc1(x.flatten(1)).relu())


def whole(c, h, w, classes):
    return Net(c, classes)


def blocks(c, h, w, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 8), nn.ReLU(), nn.Linear(8, classes))
'''


@pytest.mark.slow  # spawns the check child (torch's import)
def test_a_user_model_model_parallel_cannot_cut_is_refused_before_launch(tmp_path, capsys):
    (tmp_path / "nets.py").write_text(USER_MODELS)
    runs = tmp_path / "runs"
    assert main(["run", "quickstart", "--strategy", "model_parallel", "--devices", "cpu*2",
                 "--set", f"model.factory={tmp_path / 'nets.py'}:whole",
                 "--runs-dir", str(runs)]) == 2
    err = _error(capsys)
    assert "--strategy" in err and "not an nn.Sequential" in err and "gputui_blocks()" in err
    assert not runs.exists()  # no run folder, no failed record


@pytest.mark.slow  # spawns the check child (torch's import)
def test_the_check_child_cuts_as_the_strategy_does_and_keeps_its_answer(tmp_path):
    from gputui.runs import model_check
    from gputui.runs.prepare import prepare

    (tmp_path / "nets.py").write_text(USER_MODELS)
    cfg = load_preset(PACKAGE_PRESETS / "quickstart.toml").replace(
        model={"factory": f"{tmp_path / 'nets.py'}:blocks"}, devices={"spec": "cpu*5"},
        strategy={"name": "pp", "schedule": "gpipe"})
    problem = model_check.cut_problem(cfg)  # 4 blocks, 5 stages
    assert problem and "at most 4 stages" in problem and "'pp'" in problem
    ok = cfg.replace(devices={"spec": "cpu*2"})
    prepare(ok, "p.toml")  # cuts: nothing raised
    assert model_check.cut_problem(ok) is None
    assert sum(k[0] == ok.to_toml() for k in model_check._ANSWERS) == 1  # asked once, kept


def test_the_data_check_blames_the_flag_that_broke_it(capsys):
    assert main(["run", "quickstart", "--batch-size", "100000", "--dry-run"]) == 2
    assert _error(capsys).startswith("gputui: error: --batch-size: data: optim.batch_size")


# ------------------------------------------------------------------ the smaller ones

def test_a_folder_or_a_device_is_not_called_no_such_preset(tmp_path, capsys):
    for where, kind in ((tmp_path, "is a folder"), ("/dev/null", "is a character device")):
        assert main(["run", str(where), "--dry-run"]) == 2
        err = _error(capsys)
        assert kind in err and "no such preset" not in err
    assert main(["run", "", "--dry-run"]) == 2
    assert "empty preset name" in _error(capsys)


def test_runs_filters_and_forms_that_would_match_nothing_or_be_ignored(tmp_path, capsys):
    from run_records import write_record

    runs = tmp_path / "runs"
    write_record(runs, "20260101-100000-exp", "scratch", 1)
    base = ["runs", "--runs-dir", str(runs)]
    for flags, words in ((["--strategy", "bogus"], "'bogus' is not one of single"),
                         (["--strategy", ","], "--strategy: give one of"),
                         (["--status", "done"], "'done' is not one of finished"),
                         (["--name", ""], "--name: give part"),
                         (["--format", "csv", "--json"], "ask for two forms"),
                         (["--format", "table", "-o", str(tmp_path / "t.txt")], "terminal"),
                         (["-o", str(tmp_path / "t.txt")], "say which form")):
        assert main(base + flags) == 2, flags
        assert words in _error(capsys), flags
    assert main(base + ["-o", str(tmp_path / "t.csv")]) == 0  # the suffix names the form
    assert (tmp_path / "t.csv").read_text().startswith("id,")
    assert main(["compare", "", "--runs-dir", str(runs)]) == 2  # '' prefixes every id
    assert "empty run id" in _error(capsys)


def test_sweep_epochs_is_blamed_on_epochs_not_on_a_set(capsys):
    assert main(["sweep", "quickstart", "--epochs", "0"]) == 2
    assert _error(capsys).startswith("gputui: error: --epochs: run.epochs must be at least 1")


@pytest.mark.slow  # a real `gputui run` (its host, torch's elastic agent), stopped by SIGINT
def test_a_ddp_run_stopped_during_its_launch_prints_nothing_after_its_record_line(tmp_path):
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # node 0 of 2 waits at the rendezvous for a node that never comes: a launch in progress,
    # the moment its ranks' queue exists and no rank has started
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputui", "run", "quickstart", "--strategy", "ddp", "--devices",
         "cpu", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--set", "telemetry.enabled=false", "--runs-dir", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "waiting for 2 nodes" in line or not line:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    assert "before the ranks started" in out
    after = out.split("record: ", 1)[1].splitlines()[1:]
    # the stop contract's one last line (what was kept), then nothing: no resource_tracker
    # warning of "leaked" semaphores
    assert len(after) == 1 and after[0].startswith("gputui: stopped by SIGINT (Ctrl-C): the "
                                                   "run stopped; its record is kept"), out


def test_bench_comm_refuses_a_timeout_or_a_size_that_cannot_mean_anything(capsys):
    for flags, words in ((["--timeout", "nan"], "--timeout nan"), (["--timeout", "0"], "above 0"),
                         (["--timeout", "inf"], "--timeout inf"),
                         (["--sizes", "99999999999G"], "larger than 256G"),
                         (["--sizes", "9" * 400], "is not a size")):
        assert main(["bench-comm", *flags]) == 2, flags
        assert words in _error(capsys), flags


def test_an_empty_path_or_run_id_is_refused_not_taken_for_the_default(capsys):
    for argv, words in ((["run", "quickstart", "--runs-dir", ""], "--runs-dir: give a path"),
                        (["--runs-dir", " ", "runs"], "--runs-dir: give a path"),
                        (["sweep", "quickstart", "--export", ""], "--export: give a path"),
                        (["compare", "x", "--tensorboard", ""], "--tensorboard: give a path"),
                        (["resume", ""], "empty run id")):
        assert main(argv) == 2, argv
        assert words in _error(capsys), argv
