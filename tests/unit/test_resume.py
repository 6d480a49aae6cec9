"""Checkpoint and resume: a stopped or crashed run, resumed, ends with the parameters of the
uninterrupted run. The equivalences run the real loop in this process; one real `gputui run`
is interrupted with SIGINT and continued with `gputui resume`, end to end."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from gputui.train import strategies
from gputui.core.config import load_preset
from gputui.core.runstore import read_events
from gputui.hw.discovery import resolve_devices
from gputui.train import checkpoint as ckpt
from gputui.train.data import TensorBatches
from gputui.train.loop import train
from gputui.core.recorder import Recorder
from gputui.train.worker import execute
from strategy_harness import assert_params_close, make_config, params, small_data

GPUTUI = [sys.executable, "-m", "gputui"]


class Crash(RuntimeError):
    """Stands for the process dying mid-epoch (raised from the stop check)."""


def run_loop(cfg, run_dir: Path, stop_after: int | None = None, crash_after: int | None = None):
    """Train in this process; stop (or crash) at the stop check after ``*_after`` steps."""
    ds = small_data()
    strategy = strategies.load(cfg.strategy.name)(
        cfg, resolve_devices(cfg.devices.spec), ds.in_channels, ds.image_size, ds.num_classes)
    strategy.setup()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed)
    calls, events = [0], []

    def should_stop() -> bool:
        calls[0] += 1
        if crash_after is not None and calls[0] > crash_after:
            raise Crash("killed")
        return stop_after is not None and calls[0] > stop_after

    status = None
    try:
        status = train(cfg, strategy, batches, ds, events.append, should_stop, run_dir=run_dir)
    except Crash:
        status = "crashed"
    return strategy, status, events


@pytest.fixture(scope="module")
def scratch_reference(tmp_path_factory):
    """The uninterrupted run: scratch on 2 CPU devices, momentum (optimizer state matters)."""
    cfg = make_config("scratch", "cpu*2", "mlp", 32, **{"run.epochs": 3, "run.log_every": 3})
    strategy, status, events = run_loop(cfg, tmp_path_factory.mktemp("ref"))
    assert status == "finished"
    return cfg, strategy, events


def test_resume_after_a_stop_mid_epoch_equals_the_uninterrupted_run(scratch_reference, tmp_path):
    cfg, reference, ref_events = scratch_reference
    (tmp_path / "a").mkdir()
    _, status, _ = run_loop(cfg, tmp_path / "a", stop_after=14)
    assert status == "stopped"
    saved = ckpt.load(tmp_path / "a")
    # 10 steps per epoch; the stop check also runs once after each epoch
    assert (saved["position"]["epoch"], saved["position"]["step"]) == (2, 3)
    assert len(saved["state"]["models"]) == 1  # the replicas are equal: one copy is saved
    (tmp_path / "b").mkdir()
    resumed, status, events = run_loop(cfg.replace(run={"resume_from": str(tmp_path / "a")}),
                                       tmp_path / "b")
    assert status == "finished"
    assert events[0].kind == "log" and "epoch 2, step 3 done (global step 13)" in events[0].message
    for replica in resumed.replicas:
        assert_params_close(params(replica), params(reference.replicas[0]))
    # The resumed epochs report what the uninterrupted run reported, loss included.
    ends = [(e.epoch, e.train_loss, e.test_acc) for e in events if e.kind == "epoch_end"]
    ref_ends = [(e.epoch, e.train_loss, e.test_acc) for e in ref_events if e.kind == "epoch_end"]
    assert [e[0] for e in ends] == [2, 3]
    assert ends == pytest.approx(ref_ends[1:], rel=1e-5)
    steps = [e.global_step for e in events if e.kind == "step"]
    assert steps[0] > 13 and steps[-1] == 30


def test_resume_after_a_crash_uses_the_periodic_checkpoint(tmp_path):
    cfg = make_config("single", "cpu", "mlp", 32, **{"run.epochs": 2, "run.log_every": 4,
                                                        "run.checkpoint_every": 3})
    (tmp_path / "ref").mkdir()
    reference, status, _ = run_loop(cfg, tmp_path / "ref")
    assert status == "finished"
    (tmp_path / "a").mkdir()
    _, status, _ = run_loop(cfg, tmp_path / "a", crash_after=8)  # dies before step 9
    assert status == "crashed"
    position = ckpt.load(tmp_path / "a")["position"]
    assert (position["epoch"], position["step"], position["global_step"]) == (1, 6, 6)
    (tmp_path / "b").mkdir()
    resumed, status, _ = run_loop(cfg.replace(run={"resume_from": str(tmp_path / "a")}),
                                  tmp_path / "b")
    assert status == "finished"
    assert_params_close(params(resumed.model), params(reference.model))


def test_checkpoint_write_is_atomic_and_leaves_no_temporary(scratch_reference, tmp_path):
    cfg, strategy, _ = scratch_reference
    path = tmp_path / ckpt.CHECKPOINT_NAME
    ckpt.save(path, strategy, ckpt.Position(1, 3, 3, 1.5))
    before = path.read_bytes()
    boom = RuntimeError("disk full")

    class Broken(type(strategy)):
        def state_dict(self):
            raise boom

    strategy.__class__ = Broken  # a save that fails half way must keep the old checkpoint
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            ckpt.save(path, strategy, ckpt.Position(2, 0, 10, 0.0))
    finally:
        strategy.__class__ = Broken.__mro__[1]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.CHECKPOINT_NAME]


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    bad = tmp_path / ckpt.CHECKPOINT_NAME
    buf = io.BytesIO()
    torch.save({"format": ckpt.FORMAT, "x": Evil()}, buf)
    bad.write_bytes(buf.getvalue())
    with pytest.raises(ckpt.CheckpointError, match="not a readable gputui checkpoint"):
        ckpt.load(tmp_path)
    assert not (tmp_path / "pwned").exists()
    bad.write_bytes(buf.getvalue()[:40])  # truncated
    with pytest.raises(ckpt.CheckpointError, match="not a readable gputui checkpoint"):
        ckpt.load(bad)
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint there"):
        ckpt.load(tmp_path / "missing")


def test_a_checkpoint_of_another_strategy_is_refused(scratch_reference, tmp_path):
    _, strategy, _ = scratch_reference
    ckpt.save(tmp_path / "c.pt", strategy, ckpt.Position())
    single = make_config("single", "cpu", "mlp", 32)
    other, *_ = run_loop(single.replace(run={"epochs": 1}), None, stop_after=0)
    with pytest.raises(ckpt.CheckpointError, match="written by strategy 'scratch'"):
        ckpt.restore(other, ckpt.load(tmp_path / "c.pt"))


# ------------------------------------------------------------------ end to end
def _wait_for_step(runs: Path, proc: subprocess.Popen) -> Path:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = list(runs.glob("*/events.jsonl")) if runs.exists() else []
        if found and any(e.kind == "step" for e in read_events(found[0].parent)):
            return found[0].parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the run never reached its first logged step")


def test_gputui_resume_end_to_end(tmp_path):
    runs = tmp_path / "runs"
    args = ["run", "quickstart", "--devices", "cpu", "--strategy", "single", "--batch-size",
            "64", "--epochs", "40", "--runs-dir", str(runs), "--set", "model.name=mlp",
            "--set", "data.train_size=1024", "--set", "data.test_size=128",
            "--set", "run.log_every=2", "--set", "telemetry.enabled=false"]
    proc = subprocess.Popen([*GPUTUI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    first = _wait_for_step(runs, proc)
    trainers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert read_events(first)[-1].kind == "run_stopped"
    done = json.loads((first / "summary.json").read_text())["epochs_done"]
    target = done + 1

    out = subprocess.run([*GPUTUI, "resume", first.name, "--runs-dir", str(runs), "--epochs",
                          str(target), "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    second = Path(summary["run_dir"])
    assert second.parent == runs and second != first  # a new record; the old one is untouched
    assert summary["status"] == "finished" and summary["epochs_done"] == target
    assert read_events(first)[-1].kind == "run_stopped"
    cfg = load_preset(second / "config.toml")
    assert cfg.run.resume_from == str(first.resolve()) and cfg.run.epochs == target
    assert any("resumed from" in line for line in summary["notes"])
    assert not any(t.is_running() and t.status() != psutil.STATUS_ZOMBIE for t in trainers)

    # The uninterrupted run, in this process through the same worker code.
    ref = tmp_path / "ref"
    ref.mkdir()
    plain = load_preset(first / "config.toml").replace(run={"epochs": target})
    recorder = Recorder(ref)
    assert execute(plain, resolve_devices("cpu"), "ref", recorder.emit, ref, lambda: False,
                   time.time()) == "finished"
    recorder.close()
    got = ckpt.load(second)["state"]["models"][0]
    want = ckpt.load(ref)["state"]["models"][0]
    assert_params_close(dict(got), dict(want))

    again = subprocess.run([*GPUTUI, "resume", second.name, "--runs-dir", str(runs)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2
    epochs = f"{target} epoch" + ("s" if target != 1 else "")  # how far the stop got varies
    assert again.stderr == (f"gputui: error: {second.name} already finished its {epochs}; "
                            f"pass --epochs N with N > {target} to train it further\n")


def test_sharded_parameters_without_hooks_are_refused_not_half_saved(tmp_path):
    """DTensor parameters with the base hooks would save one rank's shards: refused clearly."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        cfg = make_config("single", "cpu", "mlp", 32, **{"run.epochs": 1})
        strategy, *_ = run_loop(cfg, None, stop_after=0)
        assert ckpt.unsupported(strategy) is None
        mesh = init_device_mesh("cpu", (1,))
        layer = strategy.model[-1]
        layer.weight = torch.nn.Parameter(distribute_tensor(layer.weight.data, mesh, [Shard(0)]))
        assert "shards its parameters and has no checkpoint hooks" in ckpt.unsupported(strategy)
        ds, events = small_data(), []
        batches = TensorBatches(ds.train_x, ds.train_y, 32, 0)
        assert train(cfg, strategy, batches, ds, events.append, lambda: True,
                     run_dir=tmp_path) == "stopped"
        assert [e.level for e in events] == ["warning"]
        assert events[0].message.endswith("cannot be checkpointed or resumed; no checkpoint is "
                                          "written")
        assert list(tmp_path.iterdir()) == []
        with pytest.raises(ckpt.CheckpointError, match="cannot be checkpointed or resumed"):
            train(cfg.replace(run={"resume_from": str(tmp_path)}), strategy, batches, ds,
                  events.append, lambda: True)
    finally:
        dist.destroy_process_group()
