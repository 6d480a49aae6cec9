"""The run host: the one kind of child process every run lives in, cold, warm or distributed.

``launcher.launch`` hands a run's :class:`~gputui.core.handoff.LaunchSpec` to a host
(``warm.Host`` is the parent's side of one): a host started for this run (cold), or one started
earlier that has imported torch and waits (warm: the app's set-up screen and a sweep start one
ahead). The host

- is the only process that writes the run's record (``recorder.Recorder``) and the only one
  that talks to the parent (``HostChannels.queue``);
- trains a single-process run itself (``worker.execute``), or starts one rank per device
  through torch's elastic launcher (``agent.run_ranks``); the ranks send it their events;
- asks the run's one stop flag (``stopping``) when a stop signal reaches it or its parent dies.

After a run a warm host puts back what a run can change and waits for the next (a run in a
reused host trains exactly as a cold one: tests/unit/test_warm.py), keeping the fork server
its ranks were forked from for the next multi-process run; a cold host exits after its run.
A host that started ranks ends their fork server and resource tracker on its way out. The
parent side imports this module torch-free (the spawn target).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any

from gputui.core import proctree, signals
from gputui.core.events import RunFailed
from gputui.core.filewrite import WriteFailed
from gputui.train import stopping
from gputui.core.handoff import HostChannels, LaunchSpec, RecordClosed, quick_exit
from gputui.core.recorder import Recorder

ORPHAN_GRACE_S = 30.0  # how long a run whose parent died may take to end its record


class _Life:
    """What the host's threads share: whether a run is in flight (set by the main thread)."""

    def __init__(self, channels: HostChannels):
        self.channels = channels
        self.running = False

    def on_signal(self, signum: int, sender: int) -> None:
        """A stop signal: the run in flight (or about to start) stops gracefully with the
        signal named. An idle warm host asks the stop too and stays: a run its parent handed
        over at that moment (in the queue, not yet taken) stops at its first step, where
        ending the host had failed it ("exited with code 0 before the run ended", a sweep's
        point on a group's Ctrl-C); the parent, which took the signal as well, closes the
        host (warm.close_all), or its death does (watch_parent)."""
        self.channels.stop.ask(signals.stop_reason(signum))

    def watch_parent(self) -> None:
        """The fault of a dead parent, for the host's whole life: stop the run in flight
        through its flag, let it end its record, then exit."""
        while not stopping.parent_gone(self.channels.parent_pid):
            time.sleep(stopping.PARENT_POLL_S)
        self.channels.stop.ask(stopping.PARENT_GONE)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while self.running and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)


def host_main(channels: HostChannels) -> None:
    """Entry point of the run host: (warm: load torch first) then host the runs it is given."""
    life = _Life(channels)
    # First, before any thread or process starts (they inherit the blocked signals): a stop
    # signal is the graceful stop, never a handler that raises in the main thread.
    signals.watch(life.on_signal)
    # CUDA must number GPUs the way discovery (NVML, PCI order) did, before torch loads CUDA.
    from gputui.hw.cuda_order import cuda_env

    os.environ.update(cuda_env())
    fresh = _load(list(channels.cuda)) if channels.warm else None
    channels.ready.set()
    threading.Thread(target=life.watch_parent, name="gputui-parent-watch", daemon=True).start()
    ranks_ran = False
    while True:
        job = channels.jobs.get()
        if job is None:
            break
        life.running = True
        ranks_ran = ranks_ran or job.multiprocess
        try:
            _host(job, channels)
        finally:
            life.running = False
        if fresh is None:
            break
        # a warm host keeps its ranks' fork server for the next multi-process run (the parent
        # retires the host after ranks that failed: runs/warm.py)
        _reset(fresh)
    if ranks_ran:  # the ranks' fork server and resource tracker go with the host
        from gputui.train.agent import stop_helpers

        stop_helpers()
    quick_exit(channels.queue, 0)


def _host(spec: LaunchSpec, channels: HostChannels) -> None:
    """Host one run: record it, train it (here or in ranks), close the record, say so."""
    try:
        recorder = Recorder(spec.run_dir, forward=channels.queue.put)
    except WriteFailed as exc:  # the parent gets the end and tries to record it
        channels.queue.put(RunFailed(reason=str(exc)))
        channels.queue.put(RecordClosed(ended=False))
        return
    try:
        if spec.multiprocess:
            from gputui.train.agent import run_ranks

            run_ranks(spec, recorder, channels.stop, note=channels.queue.put,
                      leave=lambda: _leave(recorder, channels))
        else:
            from gputui.train.worker import execute

            proctree.mark_unforkable()  # it trains here: OpenMP's threads start
            execute(spec.config, list(spec.devices), spec.run_id, recorder.emit, spec.run_dir,
                    stopping.RunStop(channels.stop), spec.t_launch, notes=spec.notes)
    except Exception as exc:  # noqa: BLE001 - the host's own fault still ends the record
        recorder.emit(RunFailed(reason=f"the run host failed: {type(exc).__name__}: {exc}",
                                detail=traceback.format_exc()))
    finally:
        recorder.close()  # summary.json: the run's record is whole from here
        channels.queue.put(RecordClosed(ended=recorder.ended))


def _leave(recorder: Any, channels: HostChannels) -> None:
    """End the host now, its record closed (a run stopped before any rank started)."""
    recorder.close()
    channels.queue.put(RecordClosed(ended=recorder.ended))
    quick_exit(channels.queue, 0)


def _load(cuda: list[int]) -> dict[str, Any]:
    """Import what a run imports; set up CUDA on ``cuda``; return the fresh process's RNG
    states (a run in this host starts from them, as a cold one does)."""
    import random

    import numpy as np
    import torch
    # The first optimizer a process builds imports torch._dynamo (torch.optim's __init__ is
    # wrapped by torch._disable_dynamo): a large part of a cold run's "model" time.
    import torch._dynamo  # noqa: F401

    from gputui.train import data, loop, models, worker  # noqa: F401 - loaded for the run
    from gputui.train.strategies import fastpath  # noqa: F401

    fresh = {"torch": torch.get_rng_state(), "random": random.getstate(),
             "numpy": np.random.get_state(), "threads": torch.get_num_threads()}
    if cuda:  # CUDA's driver is touched here
        proctree.mark_unforkable()
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
