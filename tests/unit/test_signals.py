"""The signals a real machine sends, sent for real to the whole process group of `gputui run`
(a closed terminal: SIGHUP; timeout, systemd, docker stop, SLURM: SIGTERM; Ctrl-C: SIGINT):
every strategy stops gracefully with a checkpoint and a record naming the signal; a stop that
outlasts run.stop_grace_s becomes the kill, and the record still ends. The signal is sent once
the run has logged a step; a run that finished first is accepted as finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from procs import tagged

from gputui.core.runstore import read_events
from gputui.core.signals import stop_reason

GPUTUI = [sys.executable, "-m", "gputui"]
SMALL = ["--set", "data.train_size=3000", "--set", "data.test_size=200", "--set",
         "run.log_every=2", "--set", "telemetry.enabled=false"]


def _start(runs: Path, *args: str) -> tuple[subprocess.Popen, Path, str]:
    """`gputui run` in a session of its own (a process group, as a terminal or a job has),
    returned once its record has a step event."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*GPUTUI, "run", "quickstart", "--runs-dir", str(runs), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, GPUTUI_TEST_TAG=tag))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = list(runs.glob("*/events.jsonl")) if runs.exists() else []
        if found and any(e.kind == "step" for e in read_events(found[0].parent)):
            return proc, found[0].parent, tag
        if proc.poll() is not None:
            raise AssertionError(proc.communicate())
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the run never reached its first logged step")


def _trainers(pid: int) -> list[psutil.Process]:
    """The training process (not multiprocessing's resource tracker)."""
    return [c for c in psutil.Process(pid).children(recursive=True)
            if "spawn_main" in " ".join(c.cmdline())]


def left_behind(tag: str) -> list[str]:
    """The processes this test started that are still alive, described for the message."""
    return [f"{p.pid} {p.ppid()} {' '.join(p.cmdline())[:160]}" for p in tagged(tag)]


@pytest.mark.parametrize("strategy, devices, sig", [
    ("single", "cpu", signal.SIGHUP),
    ("scratch", "cpu*2", signal.SIGTERM),
    ("dp", "cpu", signal.SIGINT),
    ("model_parallel", "cpu*2", signal.SIGTERM),
    ("ddp", "cpu*2", signal.SIGTERM),
    ("fsdp", "cpu*2", signal.SIGHUP),
])
def test_a_signal_to_the_process_group_is_a_graceful_stop(tmp_path, strategy, devices, sig):
    proc, run_dir, tag = _start(tmp_path / "runs", "--strategy", strategy, "--devices",
                                devices, "--epochs", "30", *SMALL)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    last = read_events(run_dir)[-1]
    if last.kind == "run_finished":  # all 30 epochs before the signal landed: nothing to stop
        assert proc.returncode == 128 + sig  # the stop contract: a signal came
    else:
        assert (last.kind, last.reason) == ("run_stopped", stop_reason(sig)), (out, err)
        assert summary["status"] == "stopped"
        assert proc.returncode == 128 + sig, err
        assert (run_dir / "checkpoint.pt").is_file()
    assert "Traceback" not in out + err
    assert not list(run_dir.glob("*.tmp"))
    assert left_behind(tag) == []


def test_a_stop_that_outlasts_the_grace_period_becomes_the_kill(tmp_path):
    proc, run_dir, tag = _start(tmp_path / "runs", "--strategy", "single", "--devices", "cpu",
                                "--epochs", "30", "--set", "run.stop_grace_s=1", *SMALL)
    (trainer,) = _trainers(proc.pid)
    trainer.suspend()  # a trainer that cannot stop (frozen): only the kill ends it
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    last = read_events(run_dir)[-1]
    assert last.kind == "run_stopped"
    assert last.reason == ("killed: the stop asked by SIGTERM did not end within 1 s "
                           "(run.stop_grace_s)")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"
    assert proc.returncode == 128 + signal.SIGTERM
    assert "did not stop within 1 s" in out
    assert left_behind(tag) == []


def test_sigterm_to_the_training_process_alone_stops_it_gracefully(tmp_path):
    """What systemd or SLURM do: every process of the job is signalled, the trainer too."""
    proc, run_dir, tag = _start(tmp_path / "runs", "--strategy", "scratch", "--epochs", "30",
                                *SMALL)
    (trainer,) = _trainers(proc.pid)
    trainer.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    last = read_events(run_dir)[-1]
    if last.kind != "run_finished":
        assert (last.kind, last.reason) == ("run_stopped", "stopped by SIGTERM")
        assert (run_dir / "checkpoint.pt").is_file()
        assert proc.returncode == 1  # gputui itself was not signalled: the run did not finish
    assert left_behind(tag) == []


def test_the_global_runs_dir_holds_for_every_command(tmp_path):
    """`gputui --runs-dir X run ...` writes to X and `gputui --runs-dir X runs` lists X (the
    command's own default used to override the global flag)."""
    runs = tmp_path / "elsewhere"
    env = {k: v for k, v in os.environ.items() if k != "GPUTUI_RUNS_DIR"}
    done = subprocess.run([*GPUTUI, "--runs-dir", str(runs), "run", "quickstart", "--strategy",
                           "single", "--devices", "cpu", "--epochs", "1", "--quiet", *SMALL],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert not (tmp_path / "runs").exists()
    listed = subprocess.run([*GPUTUI, "--runs-dir", str(runs), "runs", "--json"],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert run_dir.name in listed.stdout


def test_a_run_still_active_cannot_be_resumed(tmp_path):
    """`gputui resume` of a run whose gputui is still training it refuses (one line, exit 2);
    once that run has stopped, its folder is free again."""
    from gputui.runs import runlock

    runs = tmp_path / "runs"
    proc, run_dir, tag = _start(runs, "--strategy", "single", "--devices", "cpu",
                                "--epochs", "30", *SMALL)
    try:
        refused = subprocess.run([*GPUTUI, "resume", run_dir.name, "--runs-dir", str(runs)],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr == (f"gputui: error: {run_dir.name} is still running (gputui pid "
                                  f"{proc.pid}); stop that run first (Ctrl-C in its terminal, "
                                  f"or s in the app), then resume\n")
        assert len(list(runs.iterdir())) == 1  # no second copy started
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
    assert runlock.holder(run_dir) is None
    assert left_behind(tag) == []


def test_sighup_to_a_sweeps_group_stops_the_point_and_skips_the_rest(tmp_path):
    """A closed terminal during `gputui sweep`: the running point stops gracefully with the
    signal named in its record, no further point runs, the manifest is readable and says
    interrupted, and the sweep exits 128 + SIGHUP."""
    from gputui.runs.sweep.runner import load_manifest

    runs = tmp_path / "runs"
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*GPUTUI, "sweep", "quickstart", "--devices", "cpu", "--strategies",
                             "single,scratch", "--epochs", "30", "--runs-dir", str(runs),
                             "--fresh", *SMALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=dict(os.environ, GPUTUI_TEST_TAG=tag))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [p for p in runs.glob("*/events.jsonl")] if runs.exists() else []
        if found and any(e.kind == "step" for e in read_events(found[0].parent)):
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError("the sweep's first point never logged a step")
    os.killpg(proc.pid, signal.SIGHUP)
    out, err = proc.communicate(timeout=120)
    (manifest_file,) = (runs / "sweeps").glob("*.json")
    m = load_manifest(runs, manifest_file.stem)
    assert m.state == "interrupted"
    first, second = m.points
    assert second.status == "pending", second  # never started
    assert not second.run_id
    last = read_events(runs / first.run_id)[-1]
    if last.kind == "run_finished":  # 30 epochs before the signal landed: nothing to stop
        assert first.status == "finished"
    else:
        assert first.status == "stopped"
        assert (last.kind, last.reason) == ("run_stopped", stop_reason(signal.SIGHUP))
        assert proc.returncode == 128 + signal.SIGHUP, err
    assert "Traceback" not in out + err
    assert left_behind(tag) == []
