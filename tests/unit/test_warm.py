"""The warm start: a run host started early runs single-process runs without a new
interpreter, one after another, and a run in a reused host trains exactly as a cold one (no
state leaks)."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from gputui.core.config import RunConfig, apply_overrides
from gputui.core.runstore import read_events
from gputui.runs.launcher import launch
from gputui.runs import warm

pytestmark = pytest.mark.slow


def config(**extra) -> RunConfig:
    base = {"run.epochs": 1, "run.log_every": 4, "model.init": "default", "optim.momentum": 0.9,
            "data.train_size": 512, "data.test_size": 64, "optim.batch_size": 64,
            "telemetry.enabled": False, "run.threads": 1}
    base.update(extra)
    return apply_overrides(RunConfig(), [("t", k, v) for k, v in base.items()])


def run(cfg: RunConfig, runs) -> tuple[dict, int, list]:
    """(final parameters, the pid that trained, events) of one real run."""
    handle = launch(cfg, runs)
    pid = handle.host.process.pid
    assert handle.wait(timeout=240) == "finished", read_events(handle.run_dir)[-1]
    state = torch.load(handle.run_dir / "checkpoint.pt", weights_only=True)
    return state["state"]["models"][0], pid, read_events(handle.run_dir)


def test_a_reused_warm_worker_trains_as_a_cold_process(tmp_path):
    warm.close_all()
    cold, cold_pid, _ = run(config(), tmp_path)  # no warm worker: a fresh process
    worker = warm.ensure_host()
    try:
        assert worker.ready.wait(120)  # torch loaded before the run is asked for
        # a run that changes what a process keeps: other seed, threads, precision, dropout-
        # free but RNG-consuming init ("normal"), a different model
        _, first_pid, _ = run(config(**{"run.seed": 7, "run.threads": 2, "model.name": "mlp",
                                        "run.precision": "bf16", "model.init": "normal"}),
                              tmp_path)
        again, pid, events = run(config(), tmp_path)
        assert first_pid == pid == worker.process.pid != cold_pid  # reused, not re-spawned
        assert worker.usable  # alive and waiting for the next run
        assert cold.keys() == again.keys()
        for name in cold:
            assert torch.equal(cold[name], again[name]), name  # bit for bit
        init = next(e for e in events if e.kind == "init_done")
        assert init.import_s < 0.5  # torch was already imported
    finally:
        warm.close_all()
    assert not worker.process.is_alive()


def test_a_killed_warm_run_ends_its_record_and_the_worker_is_not_reused(tmp_path):
    warm.close_all()
    worker = warm.ensure_host()
    try:
        assert worker.ready.wait(120)
        handle = launch(config(**{"run.epochs": 50}), tmp_path)
        while not any(e.kind == "step" for e in read_events(handle.run_dir)):
            handle.poll(timeout=0.2)
        handle.kill()
        assert handle.wait(timeout=60) == "killed"
        assert not worker.process.is_alive() and warm.take() is None
        cold = launch(config(), tmp_path)  # the next run starts cold
        assert cold.host.process.pid != worker.process.pid
        assert cold.wait(timeout=240) == "finished"
    finally:
        warm.close_all()
    assert os.path.exists(handle.run_dir / "summary.json")


@pytest.mark.parametrize("how", ["parent", "signal"])
def test_a_stopped_warm_run_names_why_and_the_worker_serves_the_next(tmp_path, how):
    """A warm run stops as a cold one does: asked by the parent with a reason, or by a stop
    signal reaching the worker (a terminal's hang-up, a scheduler's SIGTERM)."""
    import signal as signal_mod

    warm.close_all()
    worker = warm.ensure_host()
    try:
        assert worker.ready.wait(120)
        handle = launch(config(**{"run.epochs": 50}), tmp_path)
        assert handle.host.process.pid == worker.process.pid
        while not any(e.kind == "step" for e in read_events(handle.run_dir)):
            handle.poll(timeout=0.2)
        if how == "parent":
            handle.stop("stopped by SIGTERM")  # what the CLI passes on from its own signal
        else:
            os.kill(worker.process.pid, signal_mod.SIGHUP)
        assert handle.wait(timeout=60) == "stopped"
        last = read_events(handle.run_dir)[-1]
        assert last.reason == {"parent": "stopped by SIGTERM",
                               "signal": "stopped by SIGHUP (the terminal closed)"}[how]
        assert (handle.run_dir / "checkpoint.pt").is_file()
        assert worker.process.is_alive()  # a graceful stop keeps the worker for the next run
        again = launch(config(), tmp_path)
        assert again.host.process.pid == worker.process.pid
        assert again.wait(timeout=240) == "finished"
        assert read_events(again.run_dir)[-1].kind == "run_finished"  # no stale stop reason
    finally:
        warm.close_all()


def _fork_server(host: warm.Host) -> psutil.Process:
    """The host's fork server: a fork of the host (named so) or multiprocessing's spawned one."""
    from gputui.train.agent import SERVER_NAME

    (server,) = [p for p in psutil.Process(host.process.pid).children()
                 if p.name() == SERVER_NAME or "forkserver" in " ".join(p.cmdline())]
    return server


def test_ddp_runs_reuse_one_warm_host_and_its_fork_server_and_train_as_a_cold_run(tmp_path):
    """A warm host takes multi-process runs too: the second run's ranks are forked by the fork
    server the first one started (neither the host nor the server starts again), they train
    bit for bit as a cold run's, and closing the host ends the server with it. Ranks that
    failed retire the host: the next run starts cold."""
    warm.close_all()
    ddp = {"strategy.name": "ddp", "devices.spec": "cpu*2"}
    cold, cold_pid, _ = run(config(**ddp), tmp_path)
    worker = warm.ensure_host()
    try:
        assert worker.ready.wait(120)
        _, first_pid, _ = run(config(**ddp, **{"run.seed": 7, "model.name": "mlp"}), tmp_path)
        server = _fork_server(worker)
        again, pid, events = run(config(**ddp), tmp_path)
        assert first_pid == pid == worker.process.pid != cold_pid  # reused, not re-spawned
        assert _fork_server(worker).pid == server.pid and worker.usable
        assert cold.keys() == again.keys()
        for name in cold:
            assert torch.equal(cold[name], again[name]), name  # bit for bit
        failed = launch(config(**ddp, **{"run.epochs": 50}), tmp_path)
        assert failed.host is worker
        while not any(e.kind == "step" for e in read_events(failed.run_dir)):
            failed.poll(timeout=0.2)
        os.kill(max(failed.pids().values()), 9)  # a rank killed: the run fails
        assert failed.wait(timeout=240) == "failed"
        assert not worker.process.is_alive() and warm.take() is None
    finally:
        warm.close_all()
    assert not worker.process.is_alive()
    gone, alive = psutil.wait_procs([server], timeout=10)
    assert not alive, alive  # no fork server outlives its host
