"""The CLI end to end, in subprocesses: a real run, bad input, Ctrl-C, a killed child, a
killed parent. Runs are shared through module fixtures (each costs a torch import)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputui.core.config import load_preset
from gputui.core.runstore import read_events

GPUTUI = [sys.executable, "-m", "gputui"]
pytestmark = pytest.mark.slow


def gputui(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, *args], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart, two epochs, through `gputui run --json`."""
    runs = tmp_path_factory.mktemp("runs")
    proc = gputui("run", "quickstart", "--epochs", "2", "--runs-dir", str(runs), "--json")
    return proc, runs


def test_quickstart_exits_0_and_reports_high_accuracy(quickstart):
    proc, _ = quickstart
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "finished"
    assert summary["epochs_done"] == 2 and summary["strategy"] == "scratch"
    assert summary["devices"] == ["cpu:0", "cpu:1"]
    assert summary["test_acc"] > 0.8  # chance is 0.1
    assert summary["samples_per_s"] > 0 and summary["init_s"] > 0


def test_quickstart_leaves_a_complete_record(quickstart):
    proc, runs = quickstart
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert {"config.toml", "events.jsonl", "summary.json"} <= {p.name for p in run_dir.iterdir()}
    events = read_events(run_dir)
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.count("epoch_end") == 2 and "init_done" in kinds and "step" in kinds
    steps = [e for e in events if e.kind == "step"]
    assert all(e.comm_share is not None and 0 <= e.comm_share <= 1 for e in steps)
    assert [d.device for d in steps[-1].per_device] == ["cpu:0", "cpu:1"]
    saved = load_preset(run_dir / "config.toml")
    assert saved.run.epochs == 2 and saved.strategy.name == "scratch"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"


def test_plain_output_when_not_a_terminal(quickstart):
    proc, _ = quickstart
    err = proc.stderr  # with --json, progress goes to stderr
    assert "strategy scratch on cpu:0, cpu:1" in err
    assert "epoch 1/2:" in err and "epoch 2/2:" in err and "summary: status finished" in err
    assert "\x1b[" not in err  # no terminal control codes in a log


def test_bad_preset_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlr = -1\n")
    proc = gputui("run", str(bad))
    assert proc.returncode == 2
    assert proc.stderr == f"gputui: error: {bad}: optim.lr must be greater than 0.0, got -1.0\n"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize("args,expected", [
    (("run", "quickstart", "--epochs", "zero"), "argument --epochs: invalid int value: 'zero'"),
    (("run", "quickstart", "--set", "optim.lr"), "expected table.key=value"),
    (("run", "quickstart", "--devices", "cpu*2,1"), "error: --devices: 'cpu*2,1' mixes CPU"),
    (("run", "nonexistent-preset"), "no such preset file or preset name"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
])
def test_usage_errors_exit_2_with_one_line(args, expected):
    proc = gputui(*args)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_dry_run_prints_the_resolved_config(tmp_path):
    proc = gputui("run", "quickstart", "--dry-run", "--lr", "0.3", "--set", "run.epochs=7")
    assert proc.returncode == 0
    saved = tmp_path / "resolved.toml"
    saved.write_text(proc.stdout)
    cfg = load_preset(saved)
    assert (cfg.optim.lr, cfg.run.epochs, cfg.strategy.name) == (0.3, 7, "scratch")
    as_json = json.loads(gputui("run", "quickstart", "--dry-run", "--json").stdout)
    assert as_json["devices"]["spec"] == "cpu*2"


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    runs = tmp_path / "runs"
    proc = subprocess.Popen([*GPUTUI, "run", "quickstart", "--epochs", "50", "--runs-dir",
                             str(runs), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        dirs = list(runs.glob("*/events.jsonl")) if runs.exists() else []
        if dirs and any(e.kind == "step" for e in read_events(dirs[0].parent)):
            return proc, dirs[0].parent
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the run never reached its first logged step")


def _trainers(proc_pid: int) -> list[psutil.Process]:
    kids = psutil.Process(proc_pid).children(recursive=True)
    return [k for k in kids if "spawn_main" in " ".join(k.cmdline())]


def test_ctrl_c_stops_at_next_step_and_marks_the_record_stopped(tmp_path):
    proc, run_dir = _start(tmp_path)
    trainers = _trainers(proc.pid)
    assert trainers
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    events = read_events(run_dir)
    assert events[-1].kind == "run_stopped"
    assert events[-1].reason == "stopped by SIGINT (Ctrl-C)"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    assert not any(t.is_running() and t.status() != psutil.STATUS_ZOMBIE for t in trainers)


def test_a_killed_training_process_ends_the_record_as_failed(tmp_path):
    proc, run_dir = _start(tmp_path)
    (trainer,) = _trainers(proc.pid)
    trainer.kill()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    last = read_events(run_dir)[-1]
    assert last.kind == "run_failed"
    assert last.reason == "the training process was killed by SIGKILL before the run ended"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert "run failed: the training process was killed by SIGKILL" in out


def test_a_dead_parent_never_leaves_training_running(tmp_path):
    proc, run_dir = _start(tmp_path)
    (trainer,) = _trainers(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # the CLI dies without any chance to clean up
    proc.wait(timeout=10)
    trainer.wait(timeout=30)  # the child notices its parent is gone and stops
    last = read_events(run_dir)[-1]
    assert last.kind == "run_stopped"
    assert last.reason == "the gputui process that launched the run exited"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
