"""Faults, for real: a NaN from a huge learning rate, a second Ctrl-C, out of memory raised by a
strategy, a busy GPU under --exclusive. Each checks the record, the exit status and that no
process is left. (One Ctrl-C, kill -9 of the trainer and a dead parent are in test_cli.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest
from procs import tagged
import torch

from gputui import cli
from gputui.hw import nvml
from gputui.hw.discovery import resolve_devices
from fakes.nvml import FakeGpu, FakeNvml
from gputui.core import registry
from gputui.core.runstore import read_events
from gputui.train.data import TensorBatches
from gputui.train.guards import Diverged, OutOfMemory, first_bad, largest_fitting_batch
from gputui.train import strategies
from gputui.train.loop import train
from gputui.core.recorder import Recorder
from gputui.train.strategies.single import Single
from gputui.train.worker import execute
from strategy_harness import make_config, small_data

GPUTUI = [sys.executable, "-m", "gputui"]
DIVERGED = re.compile(r"^diverged at step (\d+) \(epoch 1, step (\d+)\): the loss is (nan|inf)")


def _tagged_env() -> tuple[dict, str]:
    tag = uuid.uuid4().hex
    return dict(os.environ, GPUTUI_TEST_TAG=tag), tag


def _left_behind(tag: str) -> list[psutil.Process]:
    """Live processes started by one test (they inherit its GPUTUI_TEST_TAG)."""
    return tagged(tag)


# ------------------------------------------------------------------ divergence
@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """A real run whose huge learning rate sends the loss to NaN (with --exclusive on CPU)."""
    runs = tmp_path_factory.mktemp("runs")
    env, tag = _tagged_env()
    proc = subprocess.run(
        [*GPUTUI, "run", "quickstart", "--devices", "cpu", "--strategy", "single", "--lr", "100",
         "--batch-size", "64", "--epochs", "3", "--runs-dir", str(runs), "--exclusive",
         "--set", "model.name=mlp", "--set", "data.train_size=1024", "--set",
         "data.test_size=128", "--set", "run.log_every=8", "--set", "telemetry.enabled=false"],
        capture_output=True, text=True, timeout=300, env=env)
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return proc, run_dir, tag


def test_a_nan_loss_ends_the_run_diverged_with_exit_1(nan_run):
    proc, run_dir, tag = nan_run
    assert proc.returncode == 1, proc.stderr
    last = read_events(run_dir)[-1]
    assert last.kind == "run_failed"
    m = DIVERGED.match(last.reason)
    assert m and int(m.group(1)) <= 16 and "lower optim.lr" in last.reason
    assert f"run failed: {last.reason}" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    # Stopped at the log interval after the bad step, never a whole epoch later.
    assert not any(e.kind == "epoch_end" for e in read_events(run_dir))
    assert _left_behind(tag) == []


class PoisonAt(Single):
    """Single training whose input becomes infinite at one step: a real NaN loss."""

    poison_step = 3

    def train_step(self, x, y, data_s=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().train_step(x * float("inf") if self.calls == self.poison_step else x, y,
                                  data_s)


def _train(cls, cfg, run_dir=None):
    ds = small_data()
    strategy = cls(cfg, resolve_devices(cfg.devices.spec), ds.in_channels, ds.image_size,
                   ds.num_classes)
    strategy.setup()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed)
    events: list = []
    return train(cfg, strategy, batches, ds, events.append, lambda: False, run_dir), events


def test_the_first_bad_step_is_reported_although_checked_at_the_log_interval():
    cfg = make_config("single", "cpu", "mlp", 32, **{"run.log_every": 5, "run.epochs": 1})
    with pytest.raises(Diverged, match=r"^diverged at step 3 \(epoch 1, step 3\): the loss is nan"):
        _train(PoisonAt, cfg)


def test_on_divergence_continue_warns_once_and_finishes():
    cfg = make_config("single", "cpu", "mlp", 32, **{"run.log_every": 2, "run.epochs": 2,
                                                      "run.on_divergence": "continue"})
    status, events = _train(PoisonAt, cfg)
    assert status == "finished"
    warnings = [e.message for e in events if e.kind == "log" and e.level == "warning"]
    assert len(warnings) == 1 and warnings[0].startswith("diverged at step 3 ")
    assert sum(e.kind == "epoch_end" for e in events) == 2


def test_first_bad():
    assert first_bad(torch.tensor([1.0, 2.0])) is None
    assert first_bad(torch.tensor([1.0, float("inf"), float("nan")])) == 1


# ------------------------------------------------------------------ out of memory
class OomAbove(Single):
    """Raises torch's real OutOfMemoryError for batches above ``limit`` (no CUDA here)."""

    limit = 20

    def train_step(self, x, y, data_s=None):
        if len(x) > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {len(x)} MiB (GPU 0; 15.78 GiB total "
                f"capacity; 14.90 GiB already allocated)\nmore detail on a second line")
        return super().train_step(x, y, data_s)


@pytest.fixture
def oom_strategy(monkeypatch):
    """A registry entry for a strategy class defined here: the registry names it (torch-free),
    and the child's loader (``gputui.train.strategies.load``) hands out its class."""
    registry.register(registry.StrategyInfo("oom-test", "raises OutOfMemoryError", "single",
                                            max_devices=1))
    real = strategies.load
    monkeypatch.setattr(strategies, "load",
                        lambda name: OomAbove if name == "oom-test" else real(name))
    yield
    registry._STRATEGIES.pop("oom-test")


def test_out_of_memory_ends_the_run_with_the_largest_batch_that_fits(oom_strategy, tmp_path):
    cfg = make_config("single", "cpu", "mlp", 64, **{"data.train_size": 320, "run.epochs": 1})
    cfg = cfg.replace(strategy={"name": "oom-test"})
    recorder = Recorder(tmp_path)
    status = execute(cfg, resolve_devices("cpu"), "oom", recorder.emit, tmp_path, lambda: False,
                     time.time())
    recorder.close()
    assert status == "failed"
    last = read_events(tmp_path)[-1]
    assert last.kind == "run_failed"
    assert last.reason == (
        "out of memory at global batch size 64 (CUDA out of memory. Tried to allocate 64 MiB "
        "(GPU 0; 15.78 GiB total capacity; 14.90 GiB already allocated)); the largest global "
        "batch that fitted is 16: lower optim.batch_size to 16 (--batch-size)")


def test_out_of_memory_without_a_batch_that_fits():
    cfg = make_config("single", "cpu", "mlp", 32, **{"run.epochs": 1})
    OomAbove.limit = 0
    try:
        with pytest.raises(OutOfMemory, match=r"; lower optim.batch_size \(e.g. --batch-size 16\)"):
            _train(OomAbove, cfg)
    finally:
        OomAbove.limit = 20


def test_no_probe_across_processes():
    cfg = make_config("single", "cpu", "mlp", 32)
    strategy = OomAbove(cfg, resolve_devices("cpu"), world_size=2)
    strategy.setup()
    x, y = torch.zeros(32, 1, 28, 28), torch.zeros(32, dtype=torch.long)
    assert largest_fitting_batch(strategy, x, y) is None  # other ranks would wait forever


# ------------------------------------------------------------------ a second Ctrl-C
def test_a_second_ctrl_c_kills_and_the_record_still_ends(tmp_path):
    import psutil

    runs = tmp_path / "runs"
    env, tag = _tagged_env()
    env["PYTHONUNBUFFERED"] = "1"  # the CLI's "stopping ..." line is read as it is printed
    proc = subprocess.Popen(
        [*GPUTUI, "run", "quickstart", "--devices", "cpu", "--strategy", "single",
         "--batch-size", "16", "--epochs", "5", "--runs-dir", str(runs), "--set",
         "data.train_size=160", "--set", "data.test_size=16",
         "--set", "run.log_every=1", "--set", "telemetry.enabled=false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline and run_dir is None:
        found = list(runs.glob("*/events.jsonl")) if runs.exists() else []
        if found and any(e.kind == "step" for e in read_events(found[0].parent)):
            run_dir = found[0].parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert run_dir is not None, "the run never reached its first step"
    # Freeze the training process, so the graceful stop cannot finish before the second
    # Ctrl-C however fast this machine steps (a real signal, as a debugger or load would).
    for child in psutil.Process(proc.pid).children(recursive=True):
        if "resource_tracker" not in " ".join(child.cmdline()):  # the training process
            child.suspend()
    os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + 120
    while not any("stopping at the next step" in line for line in lines):
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.stderr.read()
    proc.wait(timeout=60)
    out = "".join(lines)
    assert proc.returncode == 130, err
    last = read_events(run_dir)[-1]
    assert last.kind == "run_stopped" and last.killed
    assert last.reason == "killed by a second signal (SIGINT (Ctrl-C))"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"
    assert "Traceback" not in out + err
    assert _left_behind(tag) == []


# ------------------------------------------------------------------ --exclusive
@pytest.fixture
def busy_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu("NVIDIA A100", "GPU-aaaa", "00000000:1A:00.0", processes=[(3999999, 2 * 1024**3)]),
            FakeGpu("NVIDIA T4", "GPU-bbbb", "00000000:3B:00.0")]
    nvml.use_module(FakeNvml(gpus))
    yield gpus
    nvml.use_module(None)


def test_exclusive_refuses_a_busy_gpu(busy_gpu, capsys, tmp_path):
    code = cli.main(["run", "quickstart", "--devices", "0,1", "--exclusive",
                     "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("gputui: error: --exclusive: cuda:0 (NVIDIA A100) is busy, used by 1 other "
                   "process(es): pid 3999999 2.0 GiB; choose free GPUs (see `gputui devices`) or "
                   "drop --exclusive\n")
    assert not (tmp_path / "runs").exists()  # nothing started


def test_without_exclusive_a_busy_gpu_is_only_a_warning(busy_gpu):
    from gputui.hw.discovery import busy_warnings

    lines = busy_warnings(resolve_devices("0,1"))
    assert len(lines) == 1 and lines[0].startswith("cuda:0 (NVIDIA A100) is busy")
