"""The agent of a multi-process run (ddp, fsdp): torch's elastic launcher, one rank per device.

``launcher.launch`` spawns one child, as for every run; for a multi-process strategy that
child runs :func:`agent_main`, which calls ``torch.distributed.launcher.api.elastic_launch``
(the engine behind ``torchrun``) with :func:`gputui.train.ranks.rank_main` as the
entrypoint: one process per local device, a c10d rendezvous (a free local port, or
``dist.rdzv_endpoint`` for several nodes), no restarts. The ranks are forked from a fork server
that imported torch once (see ``_start_fork_server``). When a rank dies or fails, the elastic
agent tears down the others; this agent then ends the record with one RunFailed that names the
root cause ("rank 1 (pid N) was killed by SIGKILL").
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gputui.core import runstore, signals
from gputui.core.events import Event, LogLine, RunFailed, RunStopped, is_terminal
from gputui.core.usercode import code_named
from gputui.train import recorder, shared_data, stopping
from gputui.train.handoff import LaunchSpec, quick_exit

# What every rank needs before its first step, imported once in the fork server (below):
# torch, DDP's own import of torch._dynamo (a large part of a rank's start-up), the training
# path. A module that fails to import here is simply imported later by the rank.
RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed.fsdp", "gputui.train.ranks",
                "gputui.train.loop", "gputui.train.data", "gputui.train.models",
                "gputui.train.strategies.ddp", "gputui.train.strategies.fsdp"]
SHUTDOWN_TIMEOUT_S = 5  # SIGTERM to SIGKILL for the surviving ranks after a failure
FAILURES_DIR = "rank-failures"  # each failing rank writes <rank>.json here (reason, detail)


def free_port() -> int:
    """A TCP port free on this machine now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_config(spec: LaunchSpec, config_class=None):
    """The elastic LaunchConfig of this node: nproc = local devices, min = max = nnodes.

    ``config_class`` is torch's ``LaunchConfig`` (a test passes an older signature). Arguments
    that only newer torch has are passed when its LaunchConfig accepts them (see
    :func:`launcher_options`), never blindly."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    config_class = config_class or LaunchConfig
    dist = spec.config["dist"]
    nnodes = dist["nnodes"]
    endpoint = dist["rdzv_endpoint"] or f"127.0.0.1:{free_port()}"
    # rank output (warnings, tracebacks) goes to files in the record, not over the progress
    logs = Path(spec.run_dir) / "ranks"
    return config_class(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=len(spec.devices),
        run_id=dist["rdzv_id"] if nnodes > 1 else spec.run_id,
        rdzv_backend="c10d", rdzv_endpoint=endpoint,
        # The first node hosts the rendezvous store; on one node, this node always does.
        rdzv_configs={"is_host": dist["node_rank"] == 0},
        max_restarts=0, start_method="forkserver", monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL),
        **launcher_options(config_class),
    )


# Launcher arguments that only newer torch accepts, with what gputui wants of them:
# signals_to_handle (torch 2.9+): SIGINT left out. The agent and its ranks block the stop
#   signals and take them in a thread (core/signals.py), so torch's own handlers never run
#   and a stop stays graceful with or without this argument; it is passed where it exists so
#   the agent's set-up matches. shutdown_timeout (torch 2.12+): SIGTERM to SIGKILL for the
#   surviving ranks after a failure (older torch waits its fixed 30 s, which only a rank that
#   ignores SIGTERM ever uses).
OPTIONAL_LAUNCH_ARGS = {"signals_to_handle": "SIGTERM,SIGHUP,SIGQUIT",
                        "shutdown_timeout": SHUTDOWN_TIMEOUT_S}


def stop_survivors_promptly(context_class: Any = None) -> None:
    """After a rank fails, the surviving ranks get SHUTDOWN_TIMEOUT_S in all to exit before
    SIGKILL, not torch's 30 s.

    The elastic agent waits for its rank processes in ``ProcessContext.join``, which, once one
    rank has failed, sends SIGTERM to the others and gives them ``grace_period`` (30 s when
    none is given, and the agent gives none in torch 2.11 to 2.13) before SIGKILL. A rank that
    cannot take SIGTERM (frozen, or stuck in a kernel call) kept a failed run waiting 30 s.
    Only this agent process, which exists for one launch, is changed: its joins get half the
    timeout to exit on their own, then half after SIGTERM.
    """
    if context_class is None:
        from torch.multiprocessing.spawn import ProcessContext as context_class
    original = context_class.join
    if getattr(original, "gputui_prompt", False):
        return

    def join(self, timeout=None, grace_period=None):
        if grace_period is None:
            grace_period = SHUTDOWN_TIMEOUT_S / 2
        return original(self, timeout, grace_period)

    join.gputui_prompt = True  # type: ignore[attr-defined]  # a mark on a function object
    context_class.join = join


def launcher_options(config_class) -> dict[str, Any]:
    """The optional arguments this torch's LaunchConfig accepts."""
    import inspect

    try:
        accepted = inspect.signature(config_class).parameters
    except (TypeError, ValueError):  # no signature to read: pass nothing optional
        return {}
    return {k: v for k, v in OPTIONAL_LAUNCH_ARGS.items() if k in accepted}


def agent_main(spec: LaunchSpec) -> None:
    """Entry point of the spawned child for ddp/fsdp: run the elastic launch, end the record."""
    # First, before any thread or process starts (they inherit the blocked signals): a stop
    # signal (SIGINT, SIGTERM, SIGHUP) is the graceful stop that the ranks agree on, asked
    # through the run's stop channel (stopping.py), never torch's handler that raises in this
    # thread and tears the ranks down (see signals.py).
    channel = spec.stop
    assert channel is not None, "launch gives a run's agent its stop channel"
    signals.watch(lambda signum, sender: channel.ask(signals.stop_reason(signum)))
    from gputui.hw.cuda_order import cuda_env

    os.environ.update(cuda_env())
    run_dir = Path(spec.run_dir)
    queue = spec.queue
    _log_to_file(run_dir / "ranks" / "agent.log")
    _start_fork_server()
    _Watchdog(spec).start()
    end = None
    data_file = shared_data.path_for(spec.run_id)
    # a rank takes SIGTERM from this process as torch's teardown, not as a stop
    spec = replace(spec, agent_pid=os.getpid(), data_file=str(data_file))
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        from gputui.train.ranks import rank_main

        if code_named(spec.config):
            # the user's code builds the data and the model here, once, before any rank
            # starts: a factory that fails ends the run with one line naming it
            problem = check_user_code(spec.config, data_file)
            if problem:
                raise _Refused(problem)
        else:
            # the dataset loads here while the ranks start, once per node (see shared_data);
            # after the imports above, so the thread never imports torch alongside this one
            shared_data.start_prefetch(spec.config["data"], data_file)

        config = launch_config(spec)
        stop_survivors_promptly()
        dist = spec.config["dist"]
        if dist["nnodes"] > 1:
            _append(run_dir, queue, LogLine(
                level="info", message=f"waiting for {dist['nnodes']} nodes at "
                f"{config.rdzv_endpoint} (rendezvous id '{config.run_id}')"))
        try:
            elastic_launch(config, rank_main)(spec)
        except ChildFailedError as exc:
            end = failure_event(exc.failures, run_dir)
    except _Refused as exc:
        end = RunFailed(reason=str(exc), detail=exc.detail)
    except Exception as exc:  # noqa: BLE001 - a rendezvous that fails, a bad endpoint, ...
        first = (str(exc).strip().splitlines() or [""])[0]
        end = RunFailed(reason=f"the elastic launch failed: {type(exc).__name__}: {first}",
                        detail=_traceback())
    shared_data.remove(data_file)
    if not _has_terminal(run_dir):
        _append(run_dir, queue, end or RunFailed(reason="the ranks ended without a result"))
    stop_helpers()
    quick_exit(queue, 0)


class _Refused(Exception):
    """The user's code failed its check before the launch; the message is one line."""

    def __init__(self, problem: tuple[str, str]):
        super().__init__(problem[0])
        self.detail = problem[1]


def check_user_code(config: dict, data_file: Path) -> tuple[str, str] | None:
    """Load the data and build the model the config's factories name (on the CPU, as every
    rank will), publish the data for the ranks, and check strategy.fsdp_wrap against the
    model; None when all is well, else (one line naming the factory and the cause, the
    traceback)."""
    from gputui.core.config import from_dict
    from gputui.train.data import load_from_config
    from gputui.train.userfactory import cause

    cfg = from_dict(config, source="run")
    try:
        ds = load_from_config(cfg.data)
        shared_data.publish(ds, data_file)
        if cfg.model.factory:
            from gputui.train.userfactory import build_model

            model = build_model(cfg.model, ds.in_channels, ds.height, ds.image_size,
                                ds.num_classes, seed=cfg.run.seed)
            if cfg.strategy.name == "fsdp":
                from gputui.train.strategies.fsdp import wrap_targets

                wrap_targets(model, list(cfg.strategy.fsdp_wrap))
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        known = type(exc).__name__ in ("UserCodeError", "DataError", "ConfigError")
        return (str(exc) if known else cause(exc)), _traceback()
    return None


def stop_helpers() -> None:
    """End the fork server and the resource tracker this process started, and wait for them:
    orphaned, they would end by themselves only a moment after this process, outliving the
    run. (multiprocessing's own stop methods are private: whatever is left is killed.)"""
    from multiprocessing import forkserver, resource_tracker

    for owner in (getattr(forkserver, "_forkserver", None),
                  getattr(resource_tracker, "_resource_tracker", None)):
        if owner is None:
            continue
        try:
            owner._stop()
        except Exception:  # noqa: BLE001 - not running, or a Python without _stop
            pass
    _kill_children()


def _start_fork_server() -> None:
    """Start the ranks' fork server now, importing RANK_PRELOAD while this process imports
    torch and loads the dataset. The server is a fresh interpreter (spawned, no threads, no
    CUDA), so forking ranks from it is safe, and each rank starts with torch already loaded
    instead of importing it again (the start-up's longest step)."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)
    forkserver.ensure_running()


def _log_to_file(path: Path) -> None:
    """The elastic agent logs (and warns) on stderr; keep that in the record, not over the
    parent's progress display."""
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def failure_event(failures: dict, run_dir: Path) -> RunFailed:
    """One RunFailed naming the root cause among the failed ranks.

    A rank that raised writes its reason to ``rank-failures/<rank>.json``; a rank killed by a
    signal leaves only its exit code. A rank whose own error is a broken connection was most
    likely a victim of another's death, so real errors and kills are preferred as the cause,
    then the earliest."""
    causes = []
    folder = run_dir / FAILURES_DIR
    written = {int(p.stem) for p in folder.glob("*.json")} if folder.is_dir() else set()
    for rank in sorted(set(failures) | written):  # torch reports only the first rank it saw
        f = failures.get(rank)
        info = _read_failure(run_dir, rank)
        if info:
            reason, detail, comm = f"rank {rank}: {info['reason']}", info["detail"], info["comm"]
            t = info["t"]
        elif f is not None:
            if f.exitcode < 0:
                how = f"was killed by {f.signal_name()}"
            else:
                how = f"exited with code {f.exitcode}"
            reason, detail, t = f"rank {rank} (pid {f.pid}) {how}", "", f.timestamp
            # SIGTERM is how the elastic agent tears the other ranks down after a failure
            comm = f.exitcode == -signal.SIGTERM
        else:  # a failure file that cannot be read, for a rank torch did not report
            continue
        causes.append((comm, t, rank, reason, detail))
    if not causes:
        return RunFailed(reason="a rank failed without saying why")
    comm, _, _, reason, detail = min(causes)
    if len(causes) > 1:
        others = "; ".join(c[3] for c in sorted(causes) if c[3] != reason)
        detail = f"{detail}\nother ranks: {others}".strip()
    return RunFailed(reason=reason, detail=detail)


def _read_failure(run_dir: Path, rank: int) -> dict | None:
    try:
        return json.loads((run_dir / FAILURES_DIR / f"{rank}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _has_terminal(run_dir: Path) -> bool:
    return any(is_terminal(e) for e in runstore.read_events(run_dir))


def _append(run_dir: Path, queue, event: Event) -> None:
    """Add one event to the record (a terminal one closes it) and to the parent's queue; on a
    full disk the parent gets the event and ends the record if it can."""
    recorder.add(run_dir, event, forward=queue.put)


def _traceback() -> str:
    import traceback

    return traceback.format_exc()


class _Watchdog(threading.Thread):
    """The faults no rank can see yet: while no rank has started (e.g. waiting for other nodes
    at the rendezvous), a stop asked through the channel or the death of gputui ends the run
    here; once ranks run, they agree on the stop themselves (see stopping.py)."""

    def __init__(self, spec: LaunchSpec):
        super().__init__(daemon=True)
        self.spec = spec
        self.run_dir = Path(spec.run_dir)

    def run(self) -> None:
        spec = self.spec
        while True:
            time.sleep(stopping.PARENT_POLL_S)
            if stopping.parent_gone(spec.parent_pid):
                reason = stopping.PARENT_GONE
            elif spec.stop is not None and spec.stop.asked():
                reason = f"{spec.stop.reason() or 'stopped by user'} before the ranks started"
            else:
                continue
            if any(e.kind == "run_started" for e in runstore.read_events(self.run_dir)):
                return  # the ranks are training: they agree on a step and stop there
            _append(self.run_dir, spec.queue, RunStopped(reason=reason))
            _kill_children()
            stop_helpers()
            shared_data.remove(shared_data.path_for(spec.run_id))
            os._exit(0)


def _kill_children() -> None:
    """Kill every process below this one and wait for them (bounded)."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
        for child in children:
            child.kill()
        psutil.wait_procs(children, timeout=5)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass
