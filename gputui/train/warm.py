"""A warm start: a training process with torch imported before the user presses Start.

The app prepares one while the user is on its set-up screen, and a sweep keeps one between its
points: ``ensure_worker()`` spawns a process that imports torch and gputui's training code (and, on
GPUs, creates the CUDA context and loads cuBLAS/cuDNN on the chosen devices), then waits for
a run. ``launch`` (launcher.py) hands a single-process run to an idle warm worker when there is
one (``take``), so the run starts without the interpreter's start and torch's import. After
the run the worker puts back the state a run can change (the RNGs as a fresh process has them,
torch.compile's caches, threads, CUDA memory) and waits for the next; a run in a reused worker
trains exactly as a cold one (tests/unit/test_warm.py). ddp and fsdp start cold: their ranks
are fresh processes started by torch's elastic agent.

The parent side of this module is torch-free. The run's handle sees the worker through a
:class:`RunProxy`, a process-like view that is "alive" while the run is in the worker.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from gputui.core import signals
from gputui.train import stopping
from gputui.train.handoff import LaunchSpec, StopChannel

_POOL: list["WarmWorker"] = []
_LOCK = threading.Lock()


@dataclass(frozen=True)
class WarmChannels:
    """What a warm worker shares with the parent for its life (spawn-context objects)."""

    queue: Any  # multiprocessing.Queue: the runs' events (the handle polls it)
    stop: StopChannel  # the stop of the run in flight (cleared before each run)
    jobs: Any  # multiprocessing.Queue: the LaunchSpecs to run; None asks the worker to exit
    ready: Any  # multiprocessing.Event: torch imported (and CUDA ready)
    idle: Any  # multiprocessing.Event: no run in the worker
    parent_pid: int  # the gputui process (the worker ends when it is gone)
    cuda: tuple[int, ...]  # the GPUs whose CUDA context the worker creates


class WarmWorker:
    """One spawned, torch-loaded process that runs single-process runs one after another."""

    def __init__(self, cuda: tuple[int, ...] = ()):
        ctx = mp.get_context("spawn")
        self.channels = WarmChannels(queue=ctx.Queue(), stop=StopChannel.create(ctx),
                                     jobs=ctx.Queue(), ready=ctx.Event(), idle=ctx.Event(),
                                     parent_pid=os.getpid(), cuda=tuple(cuda))
        self.queue, self.stop = self.channels.queue, self.channels.stop
        self.jobs, self.ready, self.idle = (self.channels.jobs, self.channels.ready,
                                            self.channels.idle)
        self.idle.set()
        self.process = ctx.Process(target=warm_main, name="gputui-warm",
                                   args=(self.channels,))
        self.process.start()
        self.cuda = tuple(cuda)

    @property
    def usable(self) -> bool:
        """Alive and waiting for a run."""
        return self.process.is_alive() and self.idle.is_set()

    def run(self, spec: LaunchSpec) -> "RunProxy":
        """Hand a run to the worker; ``spec`` as launcher.launch builds it, without its queue
        and stop channel (the worker's own are used: the handle must take them from here)."""
        self.stop.clear()  # before the job is sent, so a stop asked at once is kept
        self.idle.clear()
        self.jobs.put(replace(spec, queue=None, stop=None))
        return RunProxy(self)

    def close(self, timeout: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.process.is_alive():
            try:
                self.jobs.put(None)
            except (OSError, ValueError):
                pass
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)


class RunProxy:
    """What a RunHandle sees of a run in a warm worker: alive until the worker is idle again
    (the record closed), the worker's pid and exit code (it only exits if killed)."""

    def __init__(self, worker: WarmWorker):
        self.worker = worker

    @property
    def pid(self) -> int | None:
        return self.worker.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.worker.process.exitcode

    def is_alive(self) -> bool:
        return self.worker.process.is_alive() and not self.worker.idle.is_set()

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self.worker.idle.wait(0.1 if left is None else min(0.1, left))


def ensure_worker(cuda: tuple[int, ...] = ()) -> WarmWorker:
    """Have one warm worker ready (start it unless one is alive); returns it. ``cuda``: the
    GPU indices whose CUDA context the worker creates ahead of a run."""
    with _LOCK:
        for w in list(_POOL):
            if not w.process.is_alive():
                _POOL.remove(w)
        for w in _POOL:
            if w.cuda == tuple(cuda):
                return w
        from gputui.core.proctree import own_tracker

        own_tracker()  # before the worker's queues start the tracker (see there)
        worker = WarmWorker(tuple(cuda))
        _POOL.append(worker)
        return worker


def cuda_indices(spec: str) -> tuple[int, ...]:
    """The GPU indices a devices.spec names (empty for CPU specs or when it cannot be read)."""
    if spec.strip().startswith("cpu"):
        return ()
    try:
        from gputui.hw.discovery import resolve_devices

        return tuple(d.index for d in resolve_devices(spec) if d.kind == "cuda")
    except Exception:  # noqa: BLE001 - a warm start is an optimisation, never an error
        return ()


def take() -> WarmWorker | None:
    """An idle warm worker for the next run, or None (then the run starts cold)."""
    with _LOCK:
        return next((w for w in _POOL if w.usable), None)


def close_all() -> None:
    """No warm worker outlives gputui."""
    with _LOCK:
        workers, _POOL[:] = list(_POOL), []
    for w in workers:
        w.close()


atexit.register(close_all)
# multiprocessing's own exit handler joins every live child (a waiting worker would never
# end) and may run before the atexit hook above; its finalizers run first.
mp_util.Finalize(None, close_all, exitpriority=100)


# ---------------------------------------------------------------------- the worker's side

def warm_main(channels: WarmChannels) -> None:
    """Entry point of the warm worker: load torch, then run the jobs it is given."""
    # The stop signals, as in every training process (signals.py): the run in flight stops
    # gracefully with the signal named; an idle worker simply ends. First, before any thread.
    current: dict[str, Any] = {}
    signals.watch(lambda signum, sender: _on_signal(current, channels.idle, signum, sender))
    from gputui.hw.cuda_order import cuda_env

    os.environ.update(cuda_env())
    fresh = _load(list(channels.cuda))
    channels.ready.set()
    threading.Thread(target=_watch_parent, args=(channels.parent_pid, current),
                     daemon=True).start()
    while True:
        job = channels.jobs.get()
        if job is None:
            return
        try:
            _run(job, channels, current)
        finally:
            _reset(fresh)
            channels.idle.set()


def _on_signal(current: dict[str, Any], idle, signum: int, sender: int) -> None:
    stop = current.get("stop")
    if stop is not None:
        stop.on_signal(signum, sender)
    elif idle.is_set():
        os._exit(0)


def _load(cuda: list[int]) -> dict[str, Any]:
    """Import what a run imports; set up CUDA on ``cuda``; return the fresh process's RNG
    states (a run in this worker starts from them, as a cold one does)."""
    import random

    import numpy as np
    import torch
    # The first optimizer a process builds imports torch._dynamo (torch.optim's __init__ is
    # wrapped by torch._disable_dynamo): a large part of a cold run's "model" time.
    import torch._dynamo  # noqa: F401

    from gputui.core import registry  # noqa: F401
    from gputui.train import data, loop, models, worker  # noqa: F401 - loaded for the run
    from gputui.train.strategies import fastpath  # noqa: F401

    fresh = {"torch": torch.get_rng_state(), "random": random.getstate(),
             "numpy": np.random.get_state(), "threads": torch.get_num_threads()}
    if cuda and torch.cuda.is_available():
        for index in cuda:
            if index < torch.cuda.device_count():
                _warm_cuda(torch, torch.device("cuda", index))
        fresh["cuda"] = torch.cuda.get_rng_state_all()
    return fresh


def _warm_cuda(torch, device) -> None:
    """Create the CUDA context and load cuBLAS and cuDNN on ``device``: most of a cold run's
    model set-up on a GPU is these first-use costs, not the model."""
    x = torch.ones(8, 1, 8, 8, device=device)
    w = torch.ones(4, 1, 3, 3, device=device)
    torch.nn.functional.conv2d(x, w).sum().item()  # cuDNN
    (x.view(8, 64) @ x.view(8, 64).T).sum().item()  # cuBLAS


def _run(job: LaunchSpec, channels: WarmChannels, current: dict[str, Any]) -> None:
    from gputui.train.recorder import Recorder
    from gputui.train.worker import execute

    recorder = Recorder(job.run_dir, forward=channels.queue.put)
    # no parent watch here: the worker's own (_watch_parent) outlives the run
    stop = stopping.StopFlag(channels.stop)
    current["stop"] = stop
    try:
        execute(job.config, list(job.devices), job.run_id, recorder, stop, job.t_launch,
                notes=job.notes)
    finally:
        recorder.close()  # summary.json: the run's record is whole from here
        current.pop("stop", None)


def _reset(fresh: dict[str, Any]) -> None:
    """Put back what a run can change in the process, so the next run starts as a cold one."""
    import gc
    import random

    import numpy as np
    import torch
    import torch._dynamo

    torch.set_rng_state(fresh["torch"])
    random.setstate(fresh["random"])
    np.random.set_state(fresh["numpy"])
    torch.set_num_threads(fresh["threads"])
    torch._dynamo.reset()  # compiled graphs and their guards belong to the last run
    gc.collect()
    if torch.cuda.is_initialized():
        if "cuda" in fresh:
            torch.cuda.set_rng_state_all(fresh["cuda"])
        torch.cuda.empty_cache()


ORPHAN_GRACE_S = 30.0  # how long a run whose parent died may take to end its record


def _watch_parent(parent_pid: int, current: dict[str, Any]) -> None:
    """The fault of a dead parent, for the worker's whole life (a run's StopFlag lives only for
    that run): stop the run in flight gracefully through its flag, let it end its record,
    then exit.

    Only this process's own state is read here, never the shared ``idle`` event: a parent
    killed while it held that event's lock (it reads it to choose a worker) leaves the lock
    held for good, and a worker waiting on it outlived the app.
    """
    while True:
        time.sleep(stopping.PARENT_POLL_S)
        if not stopping.parent_gone(parent_pid):
            continue
        stop = current.get("stop")
        if stop is not None:
            stop.request(stopping.PARENT_GONE)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while current.get("stop") is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
