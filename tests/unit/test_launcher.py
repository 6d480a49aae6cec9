"""The launcher that the CLI and the app share: kill, a failing run, imports kept light."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputui.core.config import RunConfig, apply_overrides
from gputui.core.events import DeviceSample, InitDone, RunFailed, RunStarted, Status
from gputui.core.runstore import read_events, read_summary
from gputui.runs.launcher import launch

pytestmark = pytest.mark.slow


def _cfg(**changes) -> RunConfig:
    base = {"strategy.name": "scratch", "devices.spec": "cpu*2", "data.train_size": 2048,
            "data.test_size": 256, "run.epochs": 50, "run.log_every": 2, "model.init": "default"}
    base.update(changes)
    return apply_overrides(RunConfig(), [("test", k, v) for k, v in base.items()])


def test_kill_ends_the_record_killed_and_leaves_no_process(tmp_path):
    handle = launch(_cfg(), tmp_path)
    seen = []
    deadline = time.monotonic() + 240
    while not any(e.kind == "step" for e in seen) and time.monotonic() < deadline:
        seen += handle.poll(timeout=0.2)
    assert isinstance(seen[0], RunStarted) and any(isinstance(e, InitDone) for e in seen)
    # two streams: the events never carry the samples, which come from their own
    assert not any(isinstance(e, DeviceSample) for e in seen)
    sampled = handle.samples()
    assert sampled and all(isinstance(s, DeviceSample) for s in sampled)
    pid = handle.host.process.pid
    handle.kill()
    assert handle.wait(timeout=30) == "killed"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    events = read_events(handle.run_dir)
    assert events[-1].kind == "run_stopped" and events[-1].reason == "killed by user"
    assert events[-1].killed  # told from a graceful stop
    assert read_summary(handle.run_dir).status is handle.status is Status.KILLED
    samples = read_events(handle.run_dir, "telemetry.jsonl")
    assert samples and {s.device for s in samples} >= {"cpu:0", "cpu:1"}


def test_a_run_that_fails_in_the_child_says_why(tmp_path):
    cfg = _cfg(**{"data.name": "mnist", "data.root": str(tmp_path / "nothing-here")})
    handle = launch(cfg, tmp_path / "runs")
    events = []
    while not handle.done:
        events += handle.poll(timeout=0.5)
    assert handle.status == "failed"
    (failed,) = [e for e in events if isinstance(e, RunFailed)]
    assert failed.reason.startswith("mnist: missing train-images-idx3-ubyte.gz")
    assert "Traceback" in failed.detail  # the detail keeps the traceback for a bug report
    assert read_summary(handle.run_dir).reason == failed.reason


@pytest.mark.parametrize("modules,forbidden", [
    ("gputui.cli gputui.core.config gputui.core.events gputui.core.devices gputui.cli.printer "
     "gputui.core.presets gputui.runs.launcher gputui.core.runstore gputui.core.registry "
     "gputui.hw.sampler gputui.cli.devices", ("torch", "textual")),
    ("gputui.train.worker gputui.train.loop gputui.train.strategies.scratch",
     ("textual",)),
])
def test_imports_stay_light(modules, forbidden):
    code = (f"import importlib, sys\nfor m in {modules.split()!r}: importlib.import_module(m)\n"
            f"bad = [m for m in {list(forbidden)!r} if m in sys.modules]\nprint(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _host_that_ends(run_dir: str, queue, close: bool) -> None:
    """A run host's last words: its terminal event recorded and sent, then (``close``) the
    record closed; without ``close`` it dies before saying so."""
    from gputui.core.events import RunStopped
    from gputui.core.handoff import RecordClosed
    from gputui.core.recorder import Recorder

    recorder = Recorder(run_dir, forward=queue.put)
    recorder.emit(RunStopped(reason="stopped by SIGHUP (the terminal closed)"))
    if close:
        recorder.close()
        queue.put(RecordClosed(ended=recorder.ended))
    queue.close()
    queue.join_thread()


def _handle_over(run_dir: Path, target, *args):
    import multiprocessing as mp
    from types import SimpleNamespace

    from gputui.core.config import RunConfig
    from gputui.runs.launcher import RunHandle
    from gputui.core.handoff import StopChannel

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(str(run_dir), queue, *args))
    handle = RunHandle("r", run_dir, [], RunConfig())
    handle.host = SimpleNamespace(process=proc, queue=queue, stop=StopChannel.create(ctx),
                                  warm=False)
    proc.start()
    return handle


@pytest.mark.parametrize("close", [True, False])
def test_the_host_ends_the_record_and_the_parent_never_ends_it_twice(tmp_path, close):
    from gputui.core.runstore import read_events as read

    handle = _handle_over(tmp_path, _host_that_ends, close)
    assert handle.wait(timeout=60) == "stopped"
    assert [(e.kind, e.reason) for e in read(tmp_path)] == [
        ("run_stopped", "stopped by SIGHUP (the terminal closed)")]


def _host_that_dies(run_dir: str, queue) -> None:
    import os

    os._exit(3)


def test_a_host_that_dies_without_an_end_gets_one_from_the_parent(tmp_path):
    from gputui.core.runstore import read_events as read

    handle = _handle_over(tmp_path, _host_that_dies)
    assert handle.wait(timeout=60) == "failed"
    [end] = read(tmp_path)
    assert end.reason == "the training process exited with code 3 before the run ended"
    assert read_summary(tmp_path).status is Status.FAILED
