"""The parent's side of a run host (``host.py``), and the warm hosts: hosts started early.

Every run is hosted by one spawned :class:`Host`. ``launcher.launch`` starts one for the run
(cold) unless an idle warm host is waiting (``take``): the app starts one while the user is
on its set-up screen, and a sweep keeps one between its points (``ensure_host``). A warm host has
imported torch and gputui's training code (and, on GPUs, created the CUDA context and loaded
cuBLAS/cuDNN on the chosen devices), so the run starts without the interpreter's start and
torch's import; after each run it puts back what a run changes and waits for the next.

A warm host without a CUDA context takes multi-process runs (ddp, fsdp, tp, pp, mesh) too:
its elastic agent forks each run's ranks from the fork server the first one started (torch
and the training path imported there once), and keeps that server for the next run, so a
sweep's or the app's next multi-rank run starts neither the host nor the server again. The
ranks themselves are fresh processes each run (forked from the server, which never trains).
A multi-process run that did not end finished or stopped retires its host (closed, its
server with it), and no host that started a server is killed idle: it is asked to exit and
ends its server and resource tracker first.

Torch-free.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import threading

from gputui.core import signals
from gputui.core.handoff import HostChannels, LaunchSpec, StopChannel
from gputui.core import ompwait

_POOL: list["Host"] = []
_LOCK = threading.Lock()


class Host:
    """One spawned run host and the channels the parent shares with it. ``busy`` (a run was
    handed over and its record is not closed yet) is the parent's own state: the handle of
    the run sets it back with :meth:`release` once the host says the record is closed."""

    def __init__(self, warm: bool = False, cuda: tuple[int, ...] = ()):
        from gputui.train.host import host_main  # torch-free: the spawn target

        ompwait.for_children()  # before the child loads torch: inherited by all below it
        ctx = mp.get_context("spawn")
        self.channels = HostChannels(queue=ctx.Queue(), stop=StopChannel.create(ctx),
                                     jobs=ctx.Queue(), ready=ctx.Event(),
                                     parent_pid=os.getpid(), warm=warm, cuda=tuple(cuda))
        self.warm, self.cuda = warm, tuple(cuda)
        self.busy = False
        self.ranks_ran = False  # a multi-process run was handed over: the host has helpers
        self.process = ctx.Process(target=host_main, args=(self.channels,),
                                   name="gputui-warm" if warm else "gputui-host")
        # a stop signal during the host's start-up waits until the host takes it (its first
        # act): the run's graceful stop wherever the signal lands, never a traceback
        with signals.deferred():
            self.process.start()

    @property
    def queue(self):
        """The host's events and notes to the parent (multiprocessing.Queue)."""
        return self.channels.queue

    @property
    def stop(self) -> StopChannel:
        """The stop flag of the run in flight."""
        return self.channels.stop

    @property
    def ready(self):
        """Set once the host has loaded what it preloads (multiprocessing.Event)."""
        return self.channels.ready

    @property
    def usable(self) -> bool:
        """A warm host, alive and waiting for a run."""
        return self.warm and not self.busy and self.process.is_alive()

    def run(self, spec: LaunchSpec) -> None:
        """Hand a run to the host (a cold host exits after it)."""
        if self.warm:  # a cold host's flag is new: a stop its start-up already took stays
            self.stop.clear()  # before the job is sent, so a stop asked at once is kept
        self.busy = True
        self.ranks_ran = self.ranks_ran or spec.multiprocess
        self.channels.jobs.put(spec)
        if not self.warm:
            self.channels.jobs.put(None)

    def release(self) -> None:
        """The run's record is closed: a warm host may take the next run."""
        self.busy = False

    def close(self, timeout: float = 5.0) -> None:
        """Ask the host to exit; kill it if it does not. An idle warm host (no run handed
        over) holds no record and no child: it is killed at once, so quitting never waits
        for it to finish importing torch (2.3 s of the app's quit, before). One that ran
        ranks holds their fork server and resource tracker: asked to exit, it ends them."""
        if self.warm and not self.busy and not self.ranks_ran and self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
            return
        if self.process.is_alive():
            try:
                self.channels.jobs.put(None)
            except (OSError, ValueError):
                pass
            self.process.join(timeout)
        if self.process.is_alive():
            if self.ranks_ran:  # its ranks are the fork server's children, not its own
                from gputui.core.proctree import kill_tree

                kill_tree(self.process.pid)
            else:
                self.process.kill()
            self.process.join(timeout)


def ensure_host(cuda: tuple[int, ...] = ()) -> Host:
    """Have one warm host ready (start it unless one is alive); returns it. ``cuda``: the
    GPU indices whose CUDA context the host creates ahead of a run."""
    with _LOCK:
        _POOL[:] = [h for h in _POOL if h.process.is_alive()]
        for h in _POOL:
            if h.cuda == tuple(cuda):
                return h
        from gputui.core.proctree import own_tracker

        own_tracker()  # before the host's queues start the tracker (see there)
        host = Host(warm=True, cuda=tuple(cuda))
        _POOL.append(host)
        return host


def ready_for(strategy: str, devices: list) -> None:
    """Before a command's next run (a sweep's point, a verify run): have a warm host ready
    (torch is imported once per command, not per run). The host's GPUs are the run's
    ``devices`` for a one-process run; none for ranks, which create their own contexts."""
    from gputui.core import registry

    info = registry.get(strategy)
    if info is None:
        return
    ensure_host(cuda=cuda_for(info.multiprocess, devices))


def cuda_for(multiprocess: bool, devices: list) -> tuple[int, ...]:
    """The CUDA contexts a host for a run on ``devices`` holds: the GPUs of a one-process
    run; none for ranks, which create their own."""
    return () if multiprocess else tuple(d.index for d in devices if d.kind == "cuda")


def cuda_indices(spec: str) -> tuple[int, ...]:
    """The GPU indices a devices.spec names (empty for CPU specs or when it cannot be read)."""
    if spec.strip().startswith("cpu"):
        return ()
    try:
        from gputui.hw.discovery import resolve_devices

        return tuple(d.index for d in resolve_devices(spec) if d.kind == "cuda")
    except Exception:  # noqa: BLE001 - a warm start is an optimisation, never an error
        return ()


def take(cuda: tuple[int, ...] = ()) -> Host | None:
    """An idle warm host for the next run, or None (then the run starts a cold one): one
    whose CUDA contexts are the run's GPUs (``cuda``; none for a multi-process run, whose
    ranks hold the GPUs, and for a CPU run), so no host holds a context on GPUs another
    run uses."""
    with _LOCK:
        return next((h for h in _POOL if h.usable and h.cuda == tuple(cuda)), None)


def close_all() -> None:
    """No warm host outlives gputui."""
    with _LOCK:
        hosts, _POOL[:] = list(_POOL), []
    for h in hosts:
        h.close()


atexit.register(close_all)
# multiprocessing's own exit handler joins every live child (a waiting host would never end)
# and may run before the atexit hook above; its finalizers run first.
mp_util.Finalize(None, close_all, exitpriority=100)
