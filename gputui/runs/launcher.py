"""Start a run in a spawned child process and receive its events without blocking.

Shared by the headless CLI and the TUI. Importing this module does not import torch. The
run starts from a typed :class:`~gputui.train.handoff.LaunchSpec`. The handle guarantees a
record that ends with one terminal event: if the child dies without one (killed, crashed),
the handle appends it through the one record writer (``recorder``). How a stop travels from
``RunHandle.stop`` to the ranks is told in ``stopping.py``.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import threading
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputui.core import runstore
from gputui.core.config import RunConfig
from gputui.core.devices import Device
from gputui.core.events import DeviceSample, Event, RunFailed, RunStopped, is_terminal
from gputui.core.filewrite import WriteFailed, write_atomic
from gputui.core.proctree import adopt_orphans, kill_tree, own_tracker
from gputui.hw.discovery import resolve_with_note
from gputui.runs import runlock
from gputui.train import recorder
from gputui.train.handoff import LaunchSpec, RankProcess, StopChannel

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from gputui.hw.sampler import Sampler

_LIVE: "weakref.WeakSet[RunHandle]" = weakref.WeakSet()


class RunHandle:
    """A running (or finished) run: poll its events, stop it, kill it, wait for it."""

    def __init__(self, run_id: str, run_dir: Path, devices: list[Device], cfg: RunConfig):
        self.run_id, self.run_dir, self.devices, self.cfg = run_id, run_dir, devices, cfg
        self.processes: list = []  # mp.Process objects (the child; more for multi-process)
        self._queue: Queue | None = None  # the child's events, set by launch
        self._stop: StopChannel | None = None  # the run's stop channel (see stopping.py)
        self._samples: collections.deque = collections.deque(maxlen=4096)
        self._sampler: Sampler | None = None
        self._telemetry_log: runstore.EventLog | None = None
        self._done = False
        self._status = "running"
        self._kill_reason = ""
        self._lock = threading.Lock()
        self._rank_pids: dict[str, int] = {}
        self._locks: list = []  # runlock.RunLock: this folder (and a resumed one) in use
        self.multiprocess = False  # ddp/fsdp: processes[0] is the elastic agent
        self.device_note = ""  # what the devices' fallback ran on instead, or ""
        self._tree: dict[int, Any] = {}  # every process seen below the child (psutil objects)
        self._tree_t = 0.0
        self._watch: Any = None  # hw.contention.LoadWatch: what else ran meanwhile

    # ------------------------------------------------------------------ events
    def poll(self, timeout: float = 0.0, max_events: int = 10_000) -> list[Event]:
        """Events that arrived since the last call; waits at most ``timeout`` seconds."""
        out: list[Event] = []
        if self._done:
            return out
        assert self._queue is not None, "launch sets the queue before the handle is returned"
        try:
            if timeout > 0:
                out.append(self._queue.get(timeout=timeout))
            while len(out) < max_events:
                out.append(self._queue.get_nowait())
        except (queue_mod.Empty, EOFError, OSError):
            pass
        out = self._take_rank_pids(out)
        self._watch_tree()
        while self._samples and len(out) < max_events:
            out.append(self._samples.popleft())
        if any(is_terminal(e) for e in out):
            self._finish(next(e for e in out if is_terminal(e)))
        elif not self.alive:
            out.extend(self._drain_after_exit())
        return out

    def _take_rank_pids(self, items: list) -> list[Event]:
        """Keep the ranks' RankProcess notes for ``pids()``; return the events."""
        for item in items:
            if isinstance(item, RankProcess):
                self._rank_pids[item.device] = item.pid
        return [e for e in items if not isinstance(e, RankProcess)]

    def _drain_after_exit(self) -> list[Event]:
        out: list[Event] = []
        assert self._queue is not None, "launch sets the queue before the handle is returned"
        try:
            while True:
                out.append(self._queue.get(timeout=0.2))
        except (queue_mod.Empty, EOFError, OSError):
            pass
        out = self._take_rank_pids(out)
        terminal = next((e for e in out if is_terminal(e)), None)
        if terminal is None:
            # The record may already end (a warm worker is idle as soon as it has written its
            # terminal event, before its queue has carried it here): never end it twice.
            terminal = next((e for e in reversed(runstore.read_events(self.run_dir))
                             if is_terminal(e)), None) or self._record_missing_end()
            out.append(terminal)
        self._finish(terminal)
        return out

    def _record_missing_end(self) -> Event:
        """The child died without a terminal event: append one to its record."""
        codes = [p.exitcode for p in self.processes]
        if self._kill_reason:
            ev: Event = RunStopped(reason=self._kill_reason, killed=True)
        else:
            code = next((c for c in codes if c), codes[0] if codes else None)
            if code is not None and code < 0:
                try:
                    how = f"was killed by {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            else:
                how = f"exited with code {code}"
            ev = RunFailed(reason=f"the training process {how} before the run ended")
        # on a full disk the record stays whole and readers judge it by its end
        recorder.add(self.run_dir, ev)
        return ev

    def _watch_tree(self, every_s: float = 0.25) -> None:
        """Remember the processes below the child (fork server, resource tracker, ranks), so
        that none outlives the run even when the child dies without ending them."""
        now = time.monotonic()
        if now - self._tree_t < every_s:
            return
        self._tree_t = now
        try:
            import psutil

            for p in self.processes:
                if p.pid is not None and p.is_alive():
                    for c in psutil.Process(p.pid).children(recursive=True):
                        self._tree.setdefault(c.pid, c)
        except Exception:  # noqa: BLE001 - a process may end while it is read
            pass

    def _end_tree(self) -> None:
        """Wait for (then kill) every process seen below the child; the ones this process
        adopted as a subreaper are reaped, so not even a zombie is left."""
        procs = list(self._tree.values())
        if not procs:
            return
        import psutil

        _, alive = psutil.wait_procs(procs, timeout=2)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=3)
        for proc in procs:
            try:
                os.waitpid(proc.pid, os.WNOHANG)
            except (ChildProcessError, OSError):
                pass

    def _finish(self, terminal: Event) -> None:
        self._done = True
        # a terminal event that reached the queue but not the disk (the child's write failed
        # on a full disk) is appended here, where the run's reserved space may now be free
        recorder.end_if_open(self.run_dir, terminal)
        self._status = {"run_finished": "finished", "run_failed": "failed",
                        "run_stopped": "stopped"}[terminal.kind]
        if getattr(terminal, "killed", False):
            self._status = "killed"
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        if self._telemetry_log is not None:
            self._telemetry_log.close()
            self._telemetry_log = None
        for p in self.processes:
            p.join(timeout=5)
            if p.is_alive():  # the run has ended; a process stuck on its way out must go
                kill_tree(p.pid)
                p.join(timeout=5)
        self._end_tree()
        self._write_machine_state()
        if self.multiprocess:  # the node's dataset copy, left behind when the agent was killed
            from gputui.train import shared_data

            shared_data.remove(shared_data.path_for(self.run_id))
        for lock in self._locks:  # no process of the run is left: it may be resumed now
            lock.release()
        self._locks.clear()
        _LIVE.discard(self)

    def _write_machine_state(self) -> None:
        """machine.json: what else used the hardware while the run ran (hw.contention)."""
        if self._watch is None:
            return
        import json

        from gputui.core.machine import FILE

        try:
            write_atomic(self.run_dir / FILE, json.dumps(self._watch.state(), indent=2) + "\n")
        except (OSError, WriteFailed):  # the figures then carry no machine state, said so
            pass
        self._watch = None

    # ------------------------------------------------------------------ control
    @property
    def alive(self) -> bool:
        """True while any training process of the run is running."""
        return any(p.is_alive() for p in self.processes)

    @property
    def done(self) -> bool:
        """A terminal event has been delivered by ``poll``."""
        return self._done

    @property
    def status(self) -> str:
        """"running", "finished", "failed", "stopped" or "killed"."""
        return self._status

    def pids(self) -> dict[str, int]:
        """Device name to the pid of the process training on it (each rank's own pid in a
        multi-process run, once the rank has started)."""
        if self._rank_pids:
            return dict(self._rank_pids)
        if not self.processes or self.processes[0].pid is None or self.multiprocess:
            return {}
        return {d.name: self.processes[0].pid for d in self.devices}

    def stop(self, reason: str = "stopped by user") -> None:
        """Ask the run to stop at its next step; the record ends "stopped" with ``reason``
        (the first reason asked is kept). The start of the one stop path: see stopping.py."""
        if self._stop is not None:
            self._stop.ask(reason)

    def kill(self, reason: str = "killed by user") -> None:
        """Kill the training processes (and their children) now."""
        self._kill_reason = reason
        for p in self.processes:
            kill_tree(p.pid)

    def wait(self, timeout: float | None = None) -> str:
        """Poll until the run ends or ``timeout`` passes; returns the status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.poll(timeout=0.2 if left is None else min(0.2, left))
        return self._status

    def _on_sample(self, sample: DeviceSample) -> None:
        self._samples.append(sample)  # bounded: the oldest samples go first
        log = self._telemetry_log
        if log is not None:
            try:
                log.write(sample)
            except (ValueError, OSError):  # a full disk: the rest of the run's samples go
                self._telemetry_log = None
                log.close()


def launch(cfg: RunConfig, runs_dir: str | Path | None = None,
           devices: list[Device] | None = None, device_note: str = "") -> RunHandle:
    """Create the run folder, start the training process, return its handle at once.

    ``devices`` as resolved by the caller (with ``device_note``, the fallback's one line, when
    it replaced the spec's GPUs); resolved here when not given. The note goes in the record."""
    from gputui.core import registry
    from gputui.train import agent, warm, worker

    if not devices:
        devices, device_note = resolve_with_note(cfg.devices.spec, cfg.devices.fallback)
    run_id, run_dir = runstore.new_run_dir(runs_dir, cfg.run.name)
    try:  # a full or read-only disk fails here, before any training: nothing is left behind
        write_atomic(run_dir / "config.toml", cfg.to_toml())
        runstore.reserve_space(run_dir)
    except WriteFailed:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    handle = RunHandle(run_id, run_dir, devices, cfg)
    # the folder, and the one this run resumes, are in use until the run ends (gputui resume
    # refuses a folder in use; the kernel frees the lock if this process dies)
    for folder in [run_dir] + ([Path(cfg.run.resume_from)] if cfg.run.resume_from else []):
        lock = runlock.hold(folder if folder.is_dir() else folder.parent, run_id)
        if lock is not None:
            handle._locks.append(lock)
    adopt_orphans()
    own_tracker()
    handle.device_note = device_note
    info = registry.get(cfg.strategy.name)
    handle.multiprocess = bool(info and info.multiprocess)
    spec = LaunchSpec(config=cfg.to_dict(), devices=tuple(devices), run_id=run_id,
                      run_dir=str(run_dir), parent_pid=os.getpid(), t_launch=time.time(),
                      notes=(device_note,) if device_note else ())
    # a warm start (see warm.py): a prepared worker with torch loaded runs single-process runs
    ready = None if handle.multiprocess else warm.take()
    if ready is not None:
        handle._queue, handle._stop = ready.queue, ready.stop
        handle.processes.append(ready.run(spec))
    else:
        ctx = mp.get_context("spawn")
        handle._queue, handle._stop = ctx.Queue(), StopChannel.create(ctx)
        spec = replace(spec, queue=handle._queue, stop=handle._stop)
        # ddp/fsdp: the child is an agent running torch's elastic launcher, one rank per device
        target = agent.agent_main if handle.multiprocess else worker.child_main
        proc = ctx.Process(target=target, args=(spec,), name=f"gputui-{run_id}")
        proc.start()
        handle.processes.append(proc)
    _LIVE.add(handle)
    from gputui.hw.contention import LoadWatch, gpu_uuids

    handle._watch = LoadWatch(gpu_uuids(devices))
    _start_sampler(handle)
    return handle


def _start_sampler(handle: RunHandle) -> None:
    tel = handle.cfg.telemetry
    if not tel.enabled:
        return
    try:
        from gputui.hw.sampler import Sampler
    except ImportError:  # telemetry is optional for a run
        return
    try:
        handle._telemetry_log = runstore.EventLog(handle.run_dir / "telemetry.jsonl")
    except WriteFailed:  # telemetry is optional for the record; the panels still get samples
        handle._telemetry_log = None
    sampler = Sampler(handle.devices, tel.interval_s, handle._on_sample, handle.pids)
    handle._sampler = sampler
    sampler.start()


@atexit.register
def _stop_all() -> None:
    """The fault of an interpreter exiting with live runs (a script that never waited, an
    exception): ask them to stop through the one stop path (``RunHandle.stop``), then kill
    what has not ended within 10 s. Never orphan a run."""
    handles = list(_LIVE)
    for h in handles:
        h.stop()
    deadline = time.monotonic() + 10
    for h in handles:
        while h.alive and time.monotonic() < deadline:
            h.poll(timeout=0.2)
        if h.alive:
            h.kill("killed when gputui exited")
            h.wait(timeout=5)
