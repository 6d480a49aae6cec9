"""Start a run in its run host (a spawned child) and receive its events without blocking.

Shared by the headless CLI and the TUI. Importing this module does not import torch. The run
starts from a typed :class:`~gputui.core.handoff.LaunchSpec` (the ``RunConfig`` itself)
handed to a run host (``train/host.py``; ``runs/warm.py`` is the parent's side of one). The
host records the run; the handle ends the record only when the host could not (it died, or
even the space set aside refused the terminal event). How a stop travels from
``RunHandle.stop`` to the ranks is told in ``stopping.py``.
"""

from __future__ import annotations

import atexit
import collections
import os
import queue as queue_mod
import shutil
import signal
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from gputui.core import recorder, registry, runstore, signals
from gputui.core.config import RunConfig
from gputui.core.devices import Device
from gputui.core.events import DeviceSample, Event, RunFailed, RunStopped, Status, is_terminal
from gputui.core.filewrite import WriteFailed, write_atomic
from gputui.core.proctree import adopt_orphans, kill_tree, own_tracker
from gputui.core.handoff import (LaunchSpec, RankProcess, RecordClosed, data_file,
                                 remove_data_file)
from gputui.hw.discovery import resolve_with_note
from gputui.runs import energy, runlock, warm

_LIVE: "weakref.WeakSet[RunHandle]" = weakref.WeakSet()


CLOSE_WAIT_S = 10.0  # how long a host may take to close the record, then to exit


class RunHandle:
    """A running (or finished) run: its events, its devices' samples, stop, kill, wait.

    Two streams: :meth:`poll` gives the run's events (from its host), :meth:`samples` the
    devices' telemetry (from the sampler thread). One owner: the thread that polls (the
    headless loop, the TUI's pump worker) calls ``poll``, ``samples`` and ``wait``. Any thread
    may call ``stop`` (a shared flag), ``kill``, ``pids`` and read the properties; the
    sampler thread calls ``_on_sample``. What those threads share with the owner (the samples,
    the telemetry log, the rank pids, the kill reason) is guarded by ``_lock``."""

    def __init__(self, run_id: str, run_dir: Path, devices: list[Device], cfg: RunConfig,
                 multiprocess: bool = False, device_note: str = ""):
        self.run_id, self.run_dir, self.devices, self.cfg = run_id, run_dir, devices, cfg
        self.multiprocess = multiprocess  # ddp/fsdp: the host runs one rank per device
        self.device_note = device_note  # what the devices' fallback ran on instead, or ""
        self.host: Any = None  # warm.Host: the run host (its process and channels)
        self._lock = threading.Lock()
        self._samples: collections.deque = collections.deque(maxlen=4096)  # _lock
        self._telemetry_log: Any = None  # runstore.EventLog; _lock
        self._rank_pids: dict[str, int] = {}  # _lock
        self._kill_reason = ""  # _lock
        self._sampler: Any = None
        self._locks: list = []  # runlock.RunLock: this folder (and a resumed one) in use
        self._terminal: Event | None = None  # the host's terminal event, once received
        self._closed: RecordClosed | None = None  # the host's word that the record is closed
        self._dead_host_end = False  # the terminal event is the handle's own (host died)
        self._done = False
        self._status = Status.RUNNING
        self._tree: dict[int, Any] = {}  # every process seen below the host (psutil objects)
        self._tree_t = 0.0
        self._watch: Any = None  # hw.contention.LoadWatch: what else ran meanwhile
        self._energy = energy.EnergyMeter(devices)  # the GPUs' energy counters, per epoch

    def start(self, host: Any, spec: LaunchSpec, resumed: Any = None) -> None:
        """Hand the run to ``host`` (a warm.Host) and start sampling its devices. ``resumed``:
        the lock ``launch`` took on the folder this run resumes (runlock.RunLock), kept until
        the run ends."""
        # the folder, and the one this run resumes, are in use until the run ends (gputui
        # resume refuses a folder in use; the kernel frees the lock if this process dies)
        lock = runlock.hold(self.run_dir, self.run_id)
        if lock is not None:  # a watcher on another node tells a live writer by its beat
            lock.beat()
        for held in (lock, resumed):
            if held is not None:
                self._locks.append(held)
        if resumed is not None:
            resumed.label(self.run_id)
        self.host = host
        host.run(spec)
        _LIVE.add(self)
        tel = self.cfg.telemetry
        if not tel.enabled:
            return
        try:
            from gputui.hw.sampler import Sampler
        except ImportError:  # telemetry is optional for a run
            return
        try:
            self._telemetry_log = runstore.EventLog(self.run_dir / "telemetry.jsonl")
        except WriteFailed:  # optional for the record; the panels still get samples
            self._telemetry_log = None
        self._sampler = Sampler(self.devices, tel.interval_s, self._on_sample, self.pids)
        self._sampler.start()

    # ------------------------------------------------------------------ the two streams
    def poll(self, timeout: float = 0.0, max_events: int = 10_000) -> list[Event]:
        """Events that arrived since the last call; waits at most ``timeout`` seconds."""
        if self._done:
            return []
        signals.supervise(_ALL_LIVE)  # a headless command's stop signal: the stop, the kill
        out = self._take(timeout, max_events)
        self._watch_tree()
        if self._terminal is not None:
            self._await_closed()
            self._finish()
        elif not self.host.process.is_alive():
            out.extend(self._take(0.2, max_events, drain=True))
            if self._terminal is None:
                self._terminal = self._end_for_dead_host()
                self._dead_host_end = True
                out.append(self._terminal)
            self._finish()
        return out

    def samples(self) -> list[DeviceSample]:
        """The devices' samples taken since the last call (the oldest go first when nobody
        reads them: the buffer is bounded)."""
        with self._lock:
            out = list(self._samples)
            self._samples.clear()
        return out

    def _take(self, timeout: float, max_events: int, drain: bool = False) -> list[Event]:
        """Read the host's queue: events out, notes (rank pids, record closed) kept here."""
        out: list[Event] = []
        wait = timeout
        while len(out) < max_events:
            try:
                item = (self.host.queue.get(timeout=wait) if wait > 0
                        else self.host.queue.get_nowait())
            except (queue_mod.Empty, EOFError, OSError):
                break
            wait = 0.2 if drain else 0.0
            if isinstance(item, RankProcess):
                with self._lock:
                    self._rank_pids[item.device] = item.pid
            elif isinstance(item, RecordClosed):
                self._closed = item
            else:
                if is_terminal(item) and self._terminal is None:
                    self._terminal = item
                self._energy.seen(item)
                out.append(item)
        return out

    def _await_closed(self) -> None:
        """After the terminal event: wait (bounded) for the host to close the record."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._closed is None and time.monotonic() < deadline:
            if not self.host.process.is_alive():
                self._take(0.2, 100, drain=True)
                break
            self._take(0.1, 100)

    def _end_for_dead_host(self) -> Event:
        """The host died without a terminal event: the event its record ends with."""
        code = self.host.process.exitcode
        with self._lock:
            reason = self._kill_reason
        if reason:
            return RunStopped(reason=reason, killed=True)
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return RunFailed(reason=f"the training process {how} before the run ended")

    def _watch_tree(self, every_s: float = 0.25) -> None:
        """Remember the processes below a host that exits with its run (fork server, resource
        tracker, ranks), so that none outlives the run even when the host dies first."""
        now = time.monotonic()
        # a warm host's own children (a fork server it keeps) are watched once it has any
        if (self.host.warm and not self.host.ranks_ran) or now - self._tree_t < every_s:
            return
        self._tree_t = now
        try:
            import psutil

            if self.host.process.is_alive():
                for c in psutil.Process(self.host.process.pid).children(recursive=True):
                    self._tree.setdefault(c.pid, c)
        except Exception:  # noqa: BLE001 - a process may end while it is read
            pass

    def _end_tree(self) -> None:
        """Wait for (then kill) every process seen below the host; the ones this process
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

    def _finish(self) -> None:
        terminal = self._terminal
        assert terminal is not None
        self._done = True
        self._status = Status.of(terminal)  # the one place a run's status is decided
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        with self._lock:
            log, self._telemetry_log = self._telemetry_log, None
        if log is not None:
            log.close()
        host = self.host
        # ranks that did not end finished or stopped may have left something in their host
        # (its fork server), and a run stopped before any rank started ends its host: neither
        # host is reused
        retire = self.multiprocess and (
            self._status not in (Status.FINISHED, Status.STOPPED) or not self._rank_pids)
        if host.warm and self._closed is not None and host.process.is_alive() and not retire:
            host.release()
        elif host.warm and self._closed is not None and host.process.is_alive():
            host.close(timeout=CLOSE_WAIT_S)  # still busy (never taken): asked to exit, it
            # ends its fork server
            self._end_tree()
        else:  # a host that closed the record ends its helpers (a fork server) on its way out
            host.process.join(timeout=CLOSE_WAIT_S if self._closed is not None else 5)
            if host.process.is_alive():  # the run has ended; a host stuck on its way out
                kill_tree(host.process.pid)
                host.process.join(timeout=5)
            self._end_tree()
        # The one fallback, once no process of the run is left: the host died before its end
        # (``_end_for_dead_host``), or even the space set aside refused it.
        if self._closed is not None and not self._closed.ended or self._dead_host_end:
            recorder.end_after_host(self.run_dir, terminal)
        runstore.release_space(self.run_dir)
        self._write_machine_state()
        self._energy.write(self.run_dir)
        if self.multiprocess:  # the node's dataset copy, left behind when the host was killed
            remove_data_file(data_file(self.run_id))
        for lock in self._locks:  # no process of the run is left: it may be resumed now
            lock.release()
        self._locks.clear()
        _LIVE.discard(self)

    def _write_machine_state(self) -> None:
        """machine.json: what else used the hardware while the run ran (hw.contention)."""
        if self._watch is not None:
            from gputui.hw.contention import write_state

            write_state(self.run_dir, self._watch)
        self._watch = None

    # ------------------------------------------------------------------ control
    @property
    def alive(self) -> bool:
        """True while the run's host is running it (its record not closed)."""
        return (self.host is not None and self._closed is None
                and self.host.process.is_alive())

    @property
    def done(self) -> bool:
        """A terminal event has been delivered by ``poll``."""
        return self._done

    @property
    def status(self) -> Status:
        """RUNNING until the run's terminal event arrived, then how it ended."""
        return self._status

    def pids(self) -> dict[str, int]:
        """Device name to the pid of the process training on it (each rank's own pid in a
        multi-process run, once the rank has started). Any thread."""
        with self._lock:
            if self._rank_pids:
                return dict(self._rank_pids)
        pid = self.host.process.pid if self.host is not None else None
        if pid is None or self.multiprocess:
            return {}
        return {d.name: pid for d in self.devices}

    def stop(self, reason: str = "stopped by user") -> None:
        """Ask the run to stop at its next step; the record ends "stopped" with ``reason``
        (the first reason asked is kept). Any thread. The one stop path: see stopping.py."""
        if self.host is not None and not self._done:
            self.host.stop.ask(reason)

    def kill(self, reason: str = "killed by user") -> None:
        """Kill the run's host (and every process below it) now. Any thread."""
        with self._lock:
            self._kill_reason = reason
        if self.host is not None and self.host.process.pid is not None:
            kill_tree(self.host.process.pid)

    def wait(self, timeout: float | None = None) -> Status:
        """Poll until the run ends or ``timeout`` passes; returns the status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.poll(timeout=0.2 if left is None else min(0.2, left))
        return self._status

    def _on_sample(self, sample: DeviceSample) -> None:
        """The sampler thread's one entry."""
        with self._lock:
            self._samples.append(sample)  # bounded: the oldest samples go first
            log = self._telemetry_log
            if log is None:
                return
            try:
                log.write(sample)
            except (ValueError, OSError):  # a full disk: the rest of the run's samples go
                self._telemetry_log = None
                log.close()


class _AllLive:
    """Every live run of this process, as one target of the stop signals: a command's first
    signal stops them all (a measurement runs several at once), the second kills them."""

    def stop(self, reason: str) -> None:
        for h in list(_LIVE):
            h.stop(reason)

    def kill(self, reason: str) -> None:
        for h in list(_LIVE):
            h.kill(reason)


_ALL_LIVE = _AllLive()


def launch(cfg: RunConfig, runs_dir: str | Path | None = None,
           devices: list[Device] | None = None, device_note: str = "", follower: bool = False,
           id_tag: str = "") -> RunHandle:
    """Create the run folder, hand the run to a host, return its handle at once.

    ``devices`` as resolved by the caller (with ``device_note``, the fallback's one line, when
    it replaced the spec's GPUs); resolved here when not given. The note goes in the record.
    Raises ``signals.Interrupted`` (nothing made) once a headless command took a stop signal:
    no run starts after one. ``follower``: a node of a multi-node job other than the first,
    which resumes the first node's folder and leaves its lock to it (a SLURM job sharing one
    runs folder). ``id_tag`` goes into the run id (a SLURM job's "slurm123")."""
    signals.raise_if_stopped()
    if not devices:
        devices, device_note = resolve_with_note(cfg.devices.spec, cfg.devices.fallback)
    # The folder this run resumes is taken before anything is made: a second command resuming
    # it at the same moment is refused here (runlock.InUse, one line), not after a check
    # both could pass. Released when the run ends, or now when it cannot start.
    resumed = None
    if cfg.run.resume_from and not follower:
        folder = Path(cfg.run.resume_from)
        resumed = runlock.claim(folder if folder.is_dir() else folder.parent)
    try:
        return _start(cfg, runs_dir, devices, device_note, resumed, id_tag)
    except BaseException:
        if resumed is not None:
            resumed.release()
        raise


def _start(cfg: RunConfig, runs_dir: str | Path | None, devices: list[Device],
           device_note: str, resumed: Any, id_tag: str = "") -> RunHandle:
    run_id, run_dir = runstore.new_run_dir(runs_dir, cfg.run.name, id_tag)
    try:  # a full or read-only disk fails here, before any training: nothing is left behind
        write_atomic(run_dir / "config.toml", cfg.to_toml())
        runstore.reserve_space(run_dir)
    except WriteFailed:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    info = registry.get(cfg.strategy.name)
    multiprocess = bool(info and info.multiprocess)
    handle = RunHandle(run_id, run_dir, devices, cfg, multiprocess, device_note)
    adopt_orphans()
    own_tracker()
    spec = LaunchSpec(config=cfg, devices=tuple(devices), run_id=run_id, run_dir=str(run_dir),
                      parent_pid=os.getpid(), t_launch=time.time(),
                      notes=(device_note,) if device_note else (), multiprocess=multiprocess)
    # a warm host (one started early, torch loaded) takes the run when one waits
    host = warm.take(cuda=warm.cuda_for(multiprocess, devices))
    from gputui.hw.contention import LoadWatch, gpu_uuids

    handle._watch = LoadWatch(gpu_uuids(devices))
    handle.start(host or warm.Host(), spec, resumed)
    return handle


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
