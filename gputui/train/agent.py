"""How the run host trains a multi-process run (ddp, fsdp): torch's elastic launcher, one
rank per device.

:func:`run_ranks`, called in the host, runs ``torch.distributed.launcher.api.elastic_launch``
(the engine behind ``torchrun``) with :func:`gputui.train.ranks.rank_main` as the entrypoint:
one process per local device, a c10d rendezvous (a free local port, or ``dist.rdzv_endpoint``
for several nodes), no restarts. The ranks are forked from a fork server that imported torch
once (see ``_start_fork_server``) and send their events to the host over a queue
(:class:`_Relay`), which records them. When a rank dies or fails, the elastic agent tears down
the others; the host then ends the record with one RunFailed that names the root cause
("rank 1 (pid N) was killed by SIGKILL").
"""

from __future__ import annotations

import contextlib
import inspect
import os
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from gputui.core.config import RunConfig
from gputui.core import hang
from gputui.core.events import EpochEnd, LogLine, RunFailed, RunStopped, Stalled, StepMetrics
from gputui.core.hang import Ledger
from gputui.core.runstore import CHECKPOINT_NAME
from gputui.core.filewrite import WriteFailed
from gputui.core.usercode import code_named
from gputui.hw.netaddr import backend_env, interface_address
from gputui.train import peerloss, shared_data, stopping
from gputui.core import handoff, proctree
from gputui.core.handoff import LaunchSpec, RankProcess, StopChannel
from gputui.core.recorder import Recorder
from gputui.core.errors import describe

# What every rank needs before its first step, imported once in the fork server (below):
# torch, DDP's own import of torch._dynamo (a large part of a rank's start-up), the training
# path. A module that fails to import here is simply imported later by the rank.
# written out again as imports in _fork_own_server (no import by name in gputui)
RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed.fsdp", "gputui.train.ranks",
                "gputui.train.loop", "gputui.train.data", "gputui.train.models",
                "gputui.train.strategies.rank", "torch.distributed.tensor.parallel",
                "gputui.train.parallelize"]
SHUTDOWN_TIMEOUT_S = 5  # SIGTERM to SIGKILL for the surviving ranks after a failure
STALL_POLL_S = 0.5  # how often the host reads its ranks' collective counts
DUMP_WAIT_S = 3.0  # how long a hang waits for the ranks' flight-recorder dumps


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
    dist = spec.config.dist
    nnodes = dist.nnodes
    extra = launcher_options(config_class)
    address = interface_address(dist.interface) if dist.interface else None
    if address and "local_addr" in _parameters(config_class):
        extra["local_addr"] = address  # what the rendezvous gives the other nodes
    endpoint = dist.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    # rank output (warnings, tracebacks) goes to files in the record, not over the progress
    logs = Path(spec.run_dir) / "ranks"
    return config_class(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=len(spec.devices),
        run_id=dist.rdzv_id if nnodes > 1 else spec.run_id,
        rdzv_backend="c10d", rdzv_endpoint=endpoint,
        # The first node hosts the rendezvous store; on one node, this node always does.
        rdzv_configs={"is_host": dist.node_rank == 0},
        max_restarts=0, start_method="forkserver", monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL),
        **extra,
    )


# Launcher arguments that only newer torch accepts, with what gputui wants of them:
# signals_to_handle (torch 2.9+): SIGINT left out. The host and its ranks block the stop
#   signals and take them in a thread (core/signals.py), so torch's own handlers never run
#   and a stop stays graceful with or without this argument; it is passed where it exists so
#   the host's set-up matches. shutdown_timeout (torch 2.12+): SIGTERM to SIGKILL for the
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
    Only this host process, which exits after its launch, is changed: its joins get half the
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
    accepted = _parameters(config_class)
    return {k: v for k, v in OPTIONAL_LAUNCH_ARGS.items() if k in accepted}


def _parameters(config_class) -> Any:
    try:
        return inspect.signature(config_class).parameters
    except (TypeError, ValueError):  # no signature to read: pass nothing optional
        return {}


def run_ranks(spec: LaunchSpec, recorder: Recorder, stop: StopChannel,
              note: Callable[[RankProcess], Any], leave: Callable[[], None]) -> None:
    """In the host: run the elastic launch of this node's ranks, record what they send, end
    the record when they did not. ``note`` passes a rank's pid on to the parent; ``leave``
    ends the host (a stop before any rank started). The elastic agent logs (and warns) on
    stderr: into the record's ``ranks/agent.log`` while this run lasts, not over the parent's
    progress display, and not into the next run a warm host takes.
    The host calls :func:`stop_helpers` once the record is closed."""
    log = Path(spec.run_dir) / "ranks" / "agent.log"
    log.parent.mkdir(exist_ok=True)
    with _output_to(log):
        _run_ranks(spec, recorder, stop, note, leave)


def _run_ranks(spec: LaunchSpec, recorder: Recorder, stop: StopChannel,
               note: Callable[[RankProcess], Any], leave: Callable[[], None]) -> None:
    import multiprocessing as mp

    run_dir = Path(spec.run_dir)
    # before the fork server starts: the ranks it forks inherit its environment
    _start_fork_server(backend_env(spec.config.dist.interface),
                       all(d.kind == "cpu" for d in spec.devices))
    cfg = spec.config
    data_file = handoff.data_file(spec.run_id)
    relay = _Relay(mp.get_context("spawn").Queue(), recorder, stop, note)
    relay.start()
    watchdog = _Watchdog(recorder, stop, data_file, leave)
    watchdog.start()
    # one row a rank of the job, by global rank: this node's ranks write their own, and on
    # several nodes the others' arrive through the job's store (gputui.train.collectives)
    ranks = len(spec.devices) * cfg.dist.nnodes
    cells = mp.get_context("spawn").RawArray("d", Ledger.size(ranks))
    stall = _StallWatch(Ledger(cells), recorder, spec)
    stall.start()
    # a rank takes SIGTERM from this process as torch's teardown, not as a stop
    ranks_spec = replace(spec, queue=relay.queue, stop=stop, host_pid=os.getpid(),
                         data_file=str(data_file), ledger=cells)
    end = None
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        from gputui.train.ranks import failure_event, rank_main

        if code_named(cfg):
            # the user's code builds the data and the model here, once, before any rank
            # starts: a factory that fails ends the run with one line naming it
            problem = check_user_code(cfg, data_file)
            if problem:
                raise _Refused(problem)
        else:
            # the dataset loads here while the ranks start, once per node (see shared_data);
            # after the imports above, so the thread never imports torch alongside this one
            shared_data.start_prefetch(cfg.data, data_file)

        config = launch_config(spec)
        stop_survivors_promptly()
        if cfg.dist.nnodes > 1:
            recorder.emit(LogLine(
                level="info", message=f"waiting for {cfg.dist.nnodes} nodes at "
                f"{config.rdzv_endpoint} (rendezvous id '{config.run_id}')"))
        try:
            elastic_launch(config, rank_main)(ranks_spec)
        except ChildFailedError as exc:
            end = failure_event(exc.failures, run_dir)
        finally:
            _say_if_server_replaced()
    except _Refused as exc:
        end = RunFailed(reason=str(exc), detail=exc.detail)
    except Exception as exc:  # noqa: BLE001 - a rendezvous that fails, a bad endpoint, ...
        first = (str(exc).strip().splitlines() or [""])[0]
        end = RunFailed(reason=f"the elastic launch failed: {type(exc).__name__}: {first}",
                        detail=_traceback())
    watchdog.done.set()
    stall.done.set()
    # joined: in a warm host the next run shares the stop flag they watch
    watchdog.join(timeout=5)
    stall.join(timeout=5)
    if stall.end is not None:  # the ranks were stopped because one of them hung
        end = stall.end
    relay.finish()
    if isinstance(end, RunFailed):  # a node that went away, said as one
        end = peerloss.explain(end, cfg, run_dir, spec.run_id, list(recorder.events))
    handoff.remove_data_file(data_file)
    # the ranks' own end, when they sent one, is the record's (a second one is not recorded)
    recorder.emit(end or RunFailed(reason="the ranks ended without a result"))


class _Relay(threading.Thread):
    """Records what the ranks send the host (events, and their pids for the sampler). A
    write the disk refuses ends the run as it does in one process: failed, with the disk's
    line, and the ranks are asked to stop."""

    def __init__(self, queue: Any, recorder: Recorder, stop: StopChannel,
                 note: Callable[[RankProcess], Any]):
        super().__init__(name="gputui-ranks-relay", daemon=True)
        self.queue, self.recorder, self.stop, self.note = queue, recorder, stop, note
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=0.1)
            except queue_mod.Empty:
                if self._done.is_set():
                    return
                continue
            except (EOFError, OSError):
                return
            if isinstance(item, RankProcess):
                try:
                    self.note(item)
                except (OSError, ValueError):  # the parent is gone; the record goes on
                    pass
                continue
            try:
                self.recorder.emit(item)
            except WriteFailed as exc:
                if exc.disk_full:
                    from gputui.train.worker import disk_hint

                    exc.hint = disk_hint(self.recorder.run_dir)
                self.recorder.emit(RunFailed(reason=str(exc)))
                self.stop.ask(str(exc))

    def finish(self, timeout: float = 10.0) -> None:
        """The ranks have exited: take what they left in the queue, then stop."""
        self._done.set()
        self.join(timeout)


class _Refused(Exception):
    """The user's code failed its check before the launch; the message is one line."""

    def __init__(self, problem: tuple[str, str]):
        super().__init__(problem[0])
        self.detail = problem[1]


def check_user_code(cfg: RunConfig, data_file: Path) -> tuple[str, str] | None:
    """Load the data and build the model the config's factories name (on the CPU, as every
    rank will), publish the data for the ranks, and check strategy.fsdp_wrap against the
    model; None when all is well, else (one line naming the factory and the cause, the
    traceback)."""
    from gputui.train.data import load_from_config

    try:
        ds = load_from_config(cfg.data)
        shared_data.publish(ds, data_file)
        if cfg.model.factory:
            from gputui.train.userfactory import build_model

            model = build_model(cfg.model, ds.in_channels, ds.height, ds.image_size,
                                ds.num_classes, seed=cfg.run.seed)
            if cfg.strategy.name == "fsdp" or cfg.strategy.fsdp_wrap:
                from gputui.train.parallelize import fsdp_targets

                fsdp_targets(model, list(cfg.strategy.fsdp_wrap))
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        return describe(exc), _traceback()
    return None


def stop_helpers() -> None:
    """End the fork server and the resource tracker this process started, and wait for them:
    orphaned, they would end by themselves only a moment after this process, outliving the
    run. (multiprocessing's own stop methods are private: whatever is left is killed.)"""
    import multiprocessing.util as mp_util
    from multiprocessing import forkserver, resource_tracker

    # first, while the tracker (the parent's, shared) still hears this process: the
    # semaphores made here (the ranks' queue) are unlinked and unregistered by their
    # finalizers, or the host's os._exit leaves them registered and the tracker warns of them
    # as "leaked" after the parent's last line (a run stopped before its ranks started)
    try:
        mp_util._run_finalizers(0)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - on the way out: the warning is all that is at stake
        pass
    for owner in (getattr(forkserver, "_forkserver", None),
                  getattr(resource_tracker, "_resource_tracker", None)):
        if owner is None:
            continue
        try:
            owner._stop()
        except Exception:  # noqa: BLE001 - not running, or a Python without _stop
            pass
    _kill_children()


_SERVER_ENV: dict[str, str] | None = None  # what the running fork server was started with
_SERVER_PID: int | None = None  # the fork server started for this host's ranks
_FORKED_PID: int | None = None  # the fork server that is a fork of this host, if one was


def _start_fork_server(env: dict[str, str], cpu_only: bool = False) -> None:
    """Start the ranks' fork server now. Each rank is forked from it with torch already
    loaded instead of importing it again (the start-up's longest step). ``env`` (the
    backend's variables) goes into this process's environment first: the ranks inherit the
    server's. A warm host's next run finds the server running and forks from it again,
    unless its environment differs (another ``dist.interface``): then it is started anew.

    The server is this host forked (:func:`_fork_own_server`) where that is safe: ranks on
    CPU devices, a host that has computed nothing yet (CUDA untouched, OpenMP's threads not
    started), on a Python whose fork server this module knows. The host imports
    RANK_PRELOAD, which it needs for the launch anyway but for ``torch._dynamo``, and the
    server inherits them, where a spawned server imported them all again: a cold two-rank
    run's process tree took 0.64-0.65x the CPU-seconds and 0.83-0.88x the wall time, its
    launch to first step 1.00-1.05x (benchmarks/bench_startup.py, 2 idle cores, twice).
    Elsewhere (GPUs, a warm host that has trained, another Python, or
    GPUTUI_FORKSERVER=spawn) it is multiprocessing's own: a fresh interpreter (spawned: no
    threads, no CUDA) importing RANK_PRELOAD while this process imports torch and loads the
    dataset."""
    global _SERVER_ENV, _SERVER_PID, _FORKED_PID
    import multiprocessing
    from multiprocessing import forkserver

    # only this process's first server may be a fork of it: after a launch it has computed
    # (the dataset's prefetch, the user's code) and the launch's threads may live on
    first = _SERVER_ENV is None
    if _SERVER_ENV is not None and _SERVER_ENV != env:
        for name in _SERVER_ENV:
            os.environ.pop(name, None)
        server = getattr(forkserver, "_forkserver", None)
        try:
            server._stop()  # type: ignore[union-attr]  # private; absent: started anew anyway
        except Exception:  # noqa: BLE001
            pass
    os.environ.update(env)
    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)
    # the server keeps the output it was started with for its life: none (the ranks send
    # theirs to their own files; a server kept for the next run must not write into this one)
    with _output_to(Path(os.devnull)):
        if first and cpu_only and os.environ.get(SERVER_ENV, "fork") != "spawn":
            try:
                _FORKED_PID = _fork_own_server()
            except Exception:  # noqa: BLE001 - the spawned server below serves as well
                pass
        forkserver.ensure_running()  # a forked server running: nothing to do
    pid = _server_pid()
    # into the record's ranks/agent.log (this process's output while the launch lasts)
    print(f"fork server: pid {pid}, " + ("forked from this host (its imports inherited)"
          if pid == _FORKED_PID else "multiprocessing's, spawned"), file=sys.stderr,
          flush=True)
    _SERVER_ENV = dict(env)
    _SERVER_PID = pid


def _server_pid() -> int | None:
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def _say_if_server_replaced() -> None:
    """After a launch, in ranks/agent.log: the fork server the ranks came from, when it was
    not the one started (multiprocessing starts another when it finds the first ended)."""
    pid = _server_pid()
    if pid != _SERVER_PID:
        print(f"fork server: pid {_SERVER_PID} had ended; the ranks came from pid {pid}, "
              f"multiprocessing's, spawned", file=sys.stderr, flush=True)


SERVER_NAME = "gputui-forksrv"  # the forked server's process name (/proc/PID/comm)
SERVER_ENV = "GPUTUI_FORKSERVER"  # "spawn": multiprocessing's spawned server, always


def _fork_own_server() -> int | None:
    """Start the fork server as a fork of this process, RANK_PRELOAD imported here first: its
    pid; None (nothing started) where that is not known to be safe, or a server already runs.

    multiprocessing's server protocol is kept as it is (its ``main`` serves the requests, the
    clients connect as to a spawned one); only its start differs. Safe because the fork
    happens before anything computed in this process: no CUDA (the caller's ranks are on
    CPUs and torch has not initialised it), no OpenMP thread pool (a host that has trained
    in-process is refused: libgomp's pool does not survive a fork), and the host's own
    threads only wait (signals, the parent watch) and hold no lock the server takes."""
    import sys as _sys
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = getattr(forkserver, "_forkserver", None)
    needed = ("_lock", "_forkserver_pid", "_forkserver_address", "_forkserver_alive_fd")
    if server is None or not all(hasattr(server, a) for a in needed) or \
            hasattr(server, "_forkserver_authkey") or not hasattr(os, "fork"):
        return None  # another Python's fork server (3.14's authenticates its clients)
    if server._forkserver_pid is not None:
        return None  # one runs already (ensure_running checks it is alive)
    if not proctree.forkable():
        return None
    # RANK_PRELOAD, imported here for the server to inherit (written out: no dynamic import)
    import torch
    import torch._dynamo  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401

    from gputui.train import data, loop, models, parallelize, ranks  # noqa: F401
    from gputui.train.strategies import rank  # noqa: F401

    if torch.cuda.is_initialized() or not all(m in _sys.modules for m in RANK_PRELOAD):
        return None  # (a RANK_PRELOAD module the imports above lack: test_ddp_runs says so)
    import gc
    import threading
    import warnings

    gc.collect()  # no cycle left to be freed in the server, closing an fd number it reuses
    util._flush_std_streams()  # type: ignore[attr-defined]  # nothing buffered: written twice
    with server._lock:
        resource_tracker.ensure_running()
        listener = socket.socket(socket.AF_UNIX)
        try:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            with warnings.catch_warnings():  # 3.12+: fork() beside the host's idle threads
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the server: nothing of the host's but the two ends it serves on
                code = 1
                try:
                    server._lock = threading.Lock()  # held by the forking thread: a fresh one
                    _close_fds_except({0, 1, 2, listener.fileno(), alive_r})
                    proctree.set_process_name(SERVER_NAME)
                    forkserver.main(listener.fileno(), alive_r, [])
                except SystemExit:  # main's own end: no client left
                    code = 0
                finally:
                    os._exit(code)
            os.close(alive_r)
        finally:
            listener.close()
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return pid


def _close_fds_except(keep: set[int]) -> None:
    """Close every file descriptor of this process but ``keep`` (as a spawned server has only
    the ones passed to it: the host's pipes to its parent, its record and the run's files
    must not stay open in the server and the ranks): those listed open, where the system
    lists them (as _posixsubprocess does), else every number below the limit."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            fds = [int(n) for n in os.listdir(folder)]
        except (OSError, ValueError):
            continue
        for fd in fds:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:  # the listing's own, closed already
                    pass
        return
    low = 0
    for fd in sorted(keep):
        if low < fd:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), low))


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (the file descriptors: what children inherit too)
    appended to ``path`` inside the block, as they were after it."""
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


def _traceback() -> str:
    import traceback

    return traceback.format_exc()


class _Watchdog(threading.Thread):
    """The stop no rank can see yet: while no rank has started (e.g. waiting for other nodes
    at the rendezvous), a stop asked (the parent's, a signal, the parent's death) ends the
    run here; once ranks run, they agree on the stop themselves (see stopping.py). The host
    knows whether they started: it recorded their RunStarted or not."""

    def __init__(self, recorder: Recorder, stop: StopChannel, data_file: Path,
                 leave: Callable[[], None]):
        super().__init__(name="gputui-watchdog", daemon=True)
        self.recorder, self.stop, self.data_file, self.leave = recorder, stop, data_file, leave
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(stopping.PARENT_POLL_S):
            if not self.stop.asked():
                continue
            reason = self.stop.reason() or "stopped by user"
            if reason != stopping.PARENT_GONE:
                reason = f"{reason} before the ranks started"
            # as one step against the relay recording the ranks' start: once they started,
            # they agree on a step and stop there
            if not self.recorder.end_unless_started(RunStopped(reason=reason)):
                return
            _kill_children()
            stop_helpers()
            handoff.remove_data_file(self.data_file)
            self.leave()


class _StallWatch(threading.Thread):
    """A hang named (``gputui.core.hang``): reads the ranks' collective counts every
    STALL_POLL_S; when none moved for the stall threshold while a rank waits in a collective,
    records which rank is behind and where (a Stalled event), asks torch's flight recorder for
    its trace, and stops the run: its ranks killed (a hung collective takes no graceful stop),
    the record ended with the hang and the resume command (``end``)."""

    def __init__(self, ledger: Ledger, recorder: Recorder, spec: LaunchSpec):
        super().__init__(name="gputui-stall-watch", daemon=True)
        self.ledger, self.recorder, self.spec = ledger, recorder, spec
        self.flag = spec.config.strategy.stall_after_s
        self.done = threading.Event()
        self.end: RunFailed | None = None

    def run(self) -> None:
        while not self.done.wait(STALL_POLL_S):
            if self.recorder.terminal is not None:
                return  # the run has its end: its ranks are leaving, not hanging
            states = self.ledger.snapshot()
            if self.spec.config.dist.nnodes > 1:  # a rank never heard from is named too
                states = self.ledger.unheard(states)
            if not states or max(s.step for s in states) < 2:
                continue  # armed once a step has run: start-up has no step time to go by
            limit = hang.threshold(self.flag, *self._times())
            if limit is None:
                return
            if any(time.time() - s.moved < limit for s in states):
                continue
            # nothing moved: what the processes are doing (a stopped or dead one is named)
            states = hang.states_with(states, _process_states(states))
            found = hang.diagnose(states, limit)
            if found is not None and not self.done.is_set():
                self._stop_hung(found, states, limit)
                return

    def _times(self) -> tuple[list[float], list[float]]:
        events = list(self.recorder.events)
        return ([e.step_time_s for e in events if isinstance(e, StepMetrics)],
                [e.eval_s for e in events if isinstance(e, EpochEnd)])

    def _stop_hung(self, found: hang.Stall, states: tuple, limit: float) -> None:
        run_dir = Path(self.spec.run_dir)
        # a stopped or dead rank cannot answer: the others' dumps are not waited for in vain
        traces = _dump_traces(self.ledger, run_dir,
                              {s.pid for s in states if s.local and not s.process})
        resume = (f"continue it: gputui resume {self.spec.run_id}"
                  if (run_dir / CHECKPOINT_NAME).is_file()
                  else "no checkpoint to continue from (run.checkpoint)")
        self.end = RunFailed(reason=f"hang: {found.message}; stopped after {limit:.0f} s "
                                    f"without progress (--stall-after); {resume}")
        self.recorder.emit(Stalled(message=found.message, threshold_s=limit,
                                   behind=found.behind, ranks=hang.rows(states),
                                   traces=tuple(traces)))
        for s in states:  # every rank of this node: the elastic agent then ends the launch
            if not s.local:
                continue
            try:
                os.kill(s.pid, signal.SIGKILL)
            except OSError:
                pass


def _process_states(states: tuple) -> dict[int, str]:
    """pid -> "stopped: ..." or "gone" for this node's ranks whose process does not run."""
    import psutil

    out = {}
    for s in states:
        if not s.local:  # another node's process: not ours to look at
            continue
        try:
            status = psutil.Process(s.pid).status()
        except psutil.Error:
            out[s.pid] = "gone"
            continue
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            out[s.pid] = "stopped: SIGSTOP or a debugger"
        elif status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            out[s.pid] = "gone"
    return out


def _dump_traces(ledger: Ledger, run_dir: Path, running: set[int]) -> list[str]:
    """Ask the ranks for torch's flight recorder and wait (bounded) for the answers of those
    whose process runs (pids ``running``); the files written (none where this torch has no
    recorder)."""
    ledger.ask_dump()
    deadline = time.monotonic() + DUMP_WAIT_S
    while time.monotonic() < deadline:
        if all(ledger.get(r, "dump") != 1.0 for r in range(ledger.rows)
               if ledger.get(r, "local") == 1.0 and int(ledger.get(r, "pid")) in running):
            break
        time.sleep(0.1)
    return sorted(str(p.relative_to(run_dir)) for p in (run_dir / "ranks").glob("fr-trace-*"))


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
