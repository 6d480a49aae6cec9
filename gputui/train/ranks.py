"""One rank of a multi-process run (ddp, fsdp): the function torch's elastic agent starts in
the run host.

Every rank runs the ordinary ``worker.execute`` path with its place in the job
(:class:`~gputui.train.rankinfo.RankInfo`) and the run's one stop flag, which the ranks agree
on (``stopping``). Local rank 0 of each node sends the run's events to its host, which records
them; the other ranks emit nothing, their figures reach the record through the strategy's
gather at the log interval. A rank that fails does not send RunFailed: it writes its reason
to ``rank-failures/<rank>.json`` and exits non-zero, so the elastic agent tears the job down
and the host names the root cause once (:func:`failure_event`).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from gputui.core import proctree, runstore, signals
from gputui.core.events import Event, RunFailed
from gputui.core.filewrite import write_atomic
from gputui.train import shared_data, stopping
from gputui.core.handoff import LaunchSpec, RankProcess, StopChannel, quick_exit
from gputui.train.rankinfo import RankInfo
from gputui.train.worker import execute

# Text of errors that come from a broken connection to another rank: their rank is more
# likely a victim of a failure elsewhere than its cause.
COMM_MARKERS = ("DistBackendError", "DistNetworkError", "DistStoreError", "Connection closed",
                "Connection reset", "Broken pipe", "gloo", "NCCL", "timed out", "Timeout")


COMM_GRACE_S = 3.0
FAILURES_DIR = "rank-failures"  # each failing rank writes <rank>.json here (reason, detail)


class RankFailed(RuntimeError):
    """This rank's run failed; the reason is in rank-failures/<rank>.json."""


class _RankEmit:
    """What execute's ``emit`` does on a rank: send to the host on local rank 0, hold back
    RunFailed (the host names the root cause among the ranks)."""

    def __init__(self, queue: Any | None):
        self.queue = queue
        self.failed: RunFailed | None = None

    def emit(self, event: Event) -> None:
        if isinstance(event, RunFailed):
            self.failed = event
        elif self.queue is not None:
            self.queue.put(event)


def _watch_stop(stop: StopChannel, host_pid: int) -> None:
    """This rank's part of the one stop path: a stop signal asks the run's flag, except
    SIGTERM from the host, which is torch tearing the job down after a failure (the rank ends
    now, as torch expects); the host's death asks it too. Call before any thread starts."""

    def on_signal(signum: int, sender: int) -> None:
        if host_pid and sender == host_pid and signum == signal.SIGTERM:
            signals.die_by(signum)
        stop.ask(signals.stop_reason(signum))

    signals.watch(on_signal)
    parent = os.getppid()  # the fork server

    def watch() -> None:
        while not stopping.parent_gone(parent, host_pid):
            time.sleep(stopping.PARENT_POLL_S)
        stop.ask(stopping.PARENT_GONE)

    threading.Thread(target=watch, name="gputui-host-watch", daemon=True).start()


def rank_main(spec: LaunchSpec) -> str:
    """Train this rank's share; returns the status (the elastic agent collects it)."""
    stop = spec.stop
    assert stop is not None, "the host gives its ranks the run's stop flag"
    _watch_stop(stop, spec.host_pid)  # first: before any thread starts
    info = RankInfo.of_process(len(spec.devices))
    proctree.set_process_name(f"gputui-rank{info.rank}")  # not its fork server's name
    run_dir = Path(spec.run_dir)
    devices = list(spec.devices)
    queue = spec.queue
    try:  # the sampler reads CPU% and RSS of this rank's device from this pid
        queue.put(RankProcess(devices[info.local_rank].name, os.getpid(), info.rank))
    except (OSError, ValueError):
        pass
    if spec.ledger is not None:  # every collective counted, for a hang to be named
        from gputui.core.hang import Ledger
        from gputui.train.collectives import install

        install(Ledger(spec.ledger), info.rank, run_dir, info.local_rank,
                spec.config.dist.nnodes)
    sink = _RankEmit(queue if info.local_rank == 0 else None)
    try:
        load = shared_data.loader(Path(spec.data_file)) if spec.data_file else None
        status = execute(spec.config, devices, spec.run_id, sink.emit, run_dir,
                         stopping.RunStop(stop), spec.t_launch, rank=info,
                         load_data=load, notes=spec.notes)
    finally:
        _destroy_group()
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
    folder = run_dir / FAILURES_DIR
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
            from gputui.train.strategies.rank import destroy_group

            destroy_group()
    except Exception:  # noqa: BLE001 - the group may be broken after a peer died
        pass


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
