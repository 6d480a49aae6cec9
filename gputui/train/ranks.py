"""One rank of a multi-process run (ddp, fsdp): the function torch's elastic agent starts.

Every rank runs the ordinary ``worker.execute`` path with its place in the job
(:class:`~gputui.train.rankinfo.RankInfo`) and the stop every rank agrees on (``stopping``).
Local rank 0 of each node records (events.jsonl and the parent's queue); the other ranks emit
nothing, their figures reach the record through the strategy's gather at the log interval. A
rank that fails does not write RunFailed itself: it writes its reason to
``rank-failures/<rank>.json`` and exits non-zero, so the elastic agent tears the job down and
the gputui agent names the root cause once (``agent.failure_event``).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import time
from pathlib import Path

from gputui.core import runstore, signals
from gputui.core.events import Event, RunFailed
from gputui.core.filewrite import write_atomic
from gputui.train import shared_data
from gputui.train.handoff import LaunchSpec, RankProcess, quick_exit
from gputui.train.rankinfo import RankInfo
from gputui.train.recorder import Recorder
from gputui.train.stopping import StopFlag
from gputui.train.worker import execute

# Text of errors that come from a broken connection to another rank: their rank is more
# likely a victim of a failure elsewhere than its cause.
COMM_MARKERS = ("DistBackendError", "DistNetworkError", "DistStoreError", "Connection closed",
                "Connection reset", "Broken pipe", "gloo", "NCCL", "timed out", "Timeout")


COMM_GRACE_S = 3.0


class RankFailed(RuntimeError):
    """This rank's run failed; the reason is in rank-failures/<rank>.json."""


class _RankEmit:
    """What execute's ``emit`` does on a rank: record on local rank 0, hold back RunFailed."""

    def __init__(self, recorder: Recorder | None, run_dir: Path):
        self.recorder, self.run_dir = recorder, run_dir
        self.failed: RunFailed | None = None

    def emit(self, event: Event) -> None:
        if isinstance(event, RunFailed):
            self.failed = event
        elif self.recorder is not None:
            self.recorder.emit(event)


class _RankStop(StopFlag):
    """A rank's stop flag: a stop signal stops the rank at the agreed step, except SIGTERM from
    the elastic agent, which is torch tearing the job down after a failure: that ends the rank
    now, as torch expects."""

    def __init__(self, agent_pid: int, **kwargs):
        self.agent_pid = agent_pid
        super().__init__(**kwargs)

    def on_signal(self, signum: int, sender: int) -> None:
        if self.agent_pid and sender == self.agent_pid and signum == signal.SIGTERM:
            signals.die_by(signum)
        super().on_signal(signum, sender)


def rank_main(spec: LaunchSpec) -> str:
    """Train this rank's share; returns the status (the elastic agent collects it)."""
    # first: the stop signals are watched before any thread starts (see signals.watch)
    stop = _RankStop(spec.agent_pid, channel=spec.stop, parent_pid=os.getppid(),
                     origin_pid=spec.parent_pid, signals=True)
    info = RankInfo.of_process(len(spec.devices))
    run_dir = Path(spec.run_dir)
    devices = list(spec.devices)
    queue = spec.queue
    try:  # the sampler reads CPU% and RSS of this rank's device from this pid
        queue.put(RankProcess(devices[info.local_rank].name, os.getpid(), info.rank))
    except (OSError, ValueError):
        pass
    recorder = Recorder(run_dir, forward=queue.put) if info.local_rank == 0 else None
    sink = _RankEmit(recorder, run_dir)
    try:
        load = shared_data.loader(Path(spec.data_file)) if spec.data_file else None
        status = execute(spec.config, devices, spec.run_id, sink, stop, spec.t_launch,
                         rank=info, load_data=load, notes=spec.notes)
    finally:
        _destroy_group()
        if recorder is not None:
            recorder.close()
    if sink.failed is not None:
        if write_failure(run_dir, info.rank, sink.failed.reason, sink.failed.detail):
            # A broken connection: most likely a peer died. Torch's agent reports the first
            # rank it sees exit, so give it time to see that peer (the root cause) first.
            time.sleep(COMM_GRACE_S)
        raise RankFailed(f"rank {info.rank}: {sink.failed.reason}")
    # Success: the return value still has to reach the agent (torch's wrapper puts it after
    # this function returns), so the quick exit waits for the interpreter's exit hooks.
    atexit.register(quick_exit, queue, 0)
    return status


def write_failure(run_dir: Path, rank: int, reason: str, detail: str) -> bool:
    """Leave this rank's failure for the agent (atomic: the agent may read at any moment);
    True when it looks like a broken connection to another rank."""
    folder = run_dir / "rank-failures"
    comm = any(m in reason for m in COMM_MARKERS)
    text = json.dumps({"rank": rank, "pid": os.getpid(), "reason": reason, "detail": detail,
                       "comm": comm, "t": time.time()})
    for _ in range(2):
        try:
            folder.mkdir(exist_ok=True)
            write_atomic(folder / f"{rank}.json", text)
            break
        except OSError:  # a full disk: the run is ending, so use the space it set aside
            runstore.release_space(run_dir)
    return comm


def _destroy_group() -> None:
    """destroy_process_group in ``finally`` (the strategy's close() also does it on success)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from gputui.train.strategies.ddp import destroy_group

            destroy_group()
    except Exception:  # noqa: BLE001 - the group may be broken after a peer died
        pass
