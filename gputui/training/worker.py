"""The training process: entry point of the spawned child, and the in-process ``execute``.

A stop signal (SIGINT, SIGTERM, SIGHUP: see ``signals``) stops the child at its next step
with a checkpoint; it watches its parent so a dead UI never leaves it training, records
every event as it happens and ends the record with exactly one terminal event.
"""

from __future__ import annotations

import os
import re
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gputui.config import from_dict
from gputui.devices import Device
from gputui.events import (Event, InitDone, LogLine, RunFailed, RunFinished, RunStarted,
                           RunStopped, is_terminal)
from gputui.filewrite import DISK_FULL, WriteFailed, os_error_in
from gputui.training.runstore import EventLog, release_space, summarize, write_summary
from gputui.usercode import code_named


class Recorder:
    """Writes each event to events.jsonl (one whole line, written before it is passed on) and
    hands it to ``forward`` (a queue). A failed write of an event raises WriteFailed, which
    ends the run; the terminal event uses the space the run set aside, and when even that
    fails it still reaches ``forward``, whose receiver ends the record."""

    def __init__(self, run_dir: Path, forward: Callable[[Event], None] | None = None):
        self.run_dir = Path(run_dir)
        self.log = EventLog(self.run_dir / "events.jsonl")
        self.forward = forward
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        if is_terminal(event):
            release_space(self.run_dir)
            try:
                self.log.write(event)
            except WriteFailed:
                pass  # the parent gets it from the queue and tries again
        else:
            self.log.write(event)
        self.events.append(event)
        if self.forward is not None:
            try:
                self.forward(event)
            except Exception:  # noqa: BLE001 - a gone listener must not stop the record
                self.forward = None

    def close(self) -> None:
        """Write summary.json (skipped on a full disk: it is rebuilt from the events) and
        close the log."""
        release_space(self.run_dir)
        try:
            write_summary(self.run_dir, summarize(self.events))
        except WriteFailed:
            pass
        self.log.close()


class StopFlag:
    """Stop requests: from the parent (an mp.Event, with the reason in a shared buffer), from a
    signal this process received (``request``) or from the parent's death."""

    def __init__(self, event=None, parent_pid: int | None = None, origin_pid: int | None = None,
                 reason_box=None, signals: bool = False):
        self.event, self.parent_pid, self.origin_pid = event, parent_pid, origin_pid
        self.reason_box = reason_box
        self._reason = ""
        self._local = threading.Event()
        if signals:  # before any thread starts: threads inherit the blocked signals
            from gputui.training import signals as signals_mod

            signals_mod.watch(self.on_signal)
        if parent_pid:
            threading.Thread(target=self._watch_parent, daemon=True).start()

    def request(self, reason: str) -> None:
        """Stop at the next step; the first reason given is the one recorded."""
        if not self._local.is_set():
            self._reason = reason
            self._local.set()

    def on_signal(self, signum: int, sender: int) -> None:
        """A stop signal reached this process (see ``signals.watch``)."""
        from gputui.training.signals import stop_reason

        self.request(stop_reason(signum))

    @property
    def reason(self) -> str:
        if self._reason:
            return self._reason
        return read_reason(self.reason_box) or "stopped by user"

    def _watch_parent(self) -> None:
        # origin_pid: a rank's parent is the elastic agent; gputui is the agent's parent
        while not self._local.wait(0.5):
            if os.getppid() != self.parent_pid or (self.origin_pid and not _alive(self.origin_pid)):
                self.request("the gputui process that launched the run exited")

    def __call__(self) -> bool:
        return self._local.is_set() or (self.event is not None and self.event.is_set())


def read_reason(box) -> str:
    """The stop reason the parent left in the shared buffer (empty when none)."""
    if box is None:
        return ""
    try:
        return box.value.decode("utf-8", "replace")
    except (OSError, ValueError, AttributeError):
        return ""


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a multi-process run (ddp, fsdp), from torch elastic's env."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: int = 0


class _AgreedStop:
    """A stop every rank agrees on: each check is a tiny collective (MAX of the flags), so all
    ranks leave the loop at the same step and none waits forever in a collective."""

    def __init__(self, flag: Callable[[], bool], strategy):
        self.flag, self.strategy = flag, strategy
        self.reason = "stopped on another rank"

    def __call__(self) -> bool:
        agreed = self.strategy.agree_stop(bool(self.flag()))
        # asked after the collective: a stop request set in between is this rank's own too
        if agreed and self.flag():
            self.reason = getattr(self.flag, "reason", "stopped by user")
        return agreed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def execute(cfg_dict: dict, devices: list[Device], run_id: str, recorder: Recorder,
            should_stop: Callable[[], bool], t_launch: float,
            rank: RankInfo | None = None, load_data: Callable | None = None,
            notes: list[str] | tuple = ()) -> str:
    """Train one run in this process; returns the terminal status. Never raises. ``rank``
    is given in each process of a multi-process run; ``load_data`` replaces
    ``data.load_from_config`` (the ranks map the copy their agent loaded). ``notes`` are the
    launcher's lines for the record (e.g. the devices' fallback), logged after RunStarted."""
    cfg = from_dict(cfg_dict, source="run")
    emit = recorder.emit
    started = False
    try:
        from gputui.training.strategies import registry

        info = registry.get(cfg.strategy.name)

        def start() -> None:
            nonlocal started
            if not started:
                started = True
                emit(RunStarted(run_id=run_id, config=cfg_dict,
                                devices=tuple(d.to_dict() for d in devices),
                                strategy=cfg.strategy.name,
                                world_size=rank.world_size if rank else 1))
                for note in notes:
                    emit(LogLine(level="warning", message=note))

        # A preset naming the user's code starts only once that code has built the data and
        # the model: a factory that fails ends the record with one line and no run_started.
        if not code_named(cfg):
            start()
        t0 = time.perf_counter()
        import torch

        from gputui.training import data as data_mod
        from gputui.training.loop import train
        from gputui.training.models import count_params

        import_s = time.perf_counter() - t0
        _set_threads(torch, cfg.run.threads, processes=rank.local_world_size if rank else 1)
        t1 = time.perf_counter()
        ds = (load_data or data_mod.load_from_config)(cfg.data)
        t2 = time.perf_counter()
        where = {"rank": rank.rank, "world_size": rank.world_size} if rank else {}
        strategy = info.load()(cfg, devices, ds.in_channels, ds.image_size, ds.num_classes,
                               height=ds.height, **where)
        strategy.setup()
        start()
        if rank is not None:
            should_stop = _AgreedStop(should_stop, strategy)
        batches = data_mod.make_batches(ds, strategy.batch_size, cfg.run.seed,
                                        strategy.data_device(), cfg.data.loader, cfg.data.workers,
                                        cfg.run.channels_last)
        t3 = time.perf_counter()
        from gputui.training.strategies import fastpath

        compile_s = fastpath.prepare(strategy, ds, emit)  # before the first step, timed apart
        for note in strategy.notes:
            emit(LogLine(level="info", message=note))
        emit(InitDone(seconds=time.time() - t_launch, import_s=import_s, data_s=t2 - t1,
                      model_s=t3 - t2, compile_s=compile_s, train_samples=ds.n_train,
                      test_samples=ds.n_test, steps_per_epoch=batches.steps_per_epoch,
                      params=count_params(strategy.primary_model()),
                      threads=torch.get_num_threads(), cores=_cores()))
        t_train = time.time()
        status = train(cfg, strategy, batches, ds, emit, should_stop, run_dir=recorder.run_dir)
        strategy.close()
        if status == "stopped":
            emit(RunStopped(reason=getattr(should_stop, "reason", "stopped by user")))
        else:
            emit(RunFinished(seconds=time.time() - t_train))
        return status
    except WriteFailed as exc:  # a full disk or a refused write: one line, no traceback
        if exc.disk_full:
            exc.hint = disk_hint(recorder.run_dir, run_id)
        emit(RunFailed(reason=str(exc)))
        return "failed"
    except Exception as exc:  # noqa: BLE001 - every failure must end the record
        cause = os_error_in(exc) if not isinstance(exc, OSError) else None
        if cause is not None and cause.errno in DISK_FULL:  # e.g. a user's code writing files
            emit(RunFailed(reason=f"{_one_line(exc)}: {cause.strerror} "
                                  f"({disk_hint(recorder.run_dir, run_id)})"))
            return "failed"
        emit(RunFailed(reason=_one_line(exc), detail=traceback.format_exc()))
        return "failed"


def disk_hint(run_dir: Path, run_id: str = "") -> str:
    """What to do after a full disk ended a run: resume when a checkpoint was written."""
    from gputui.training.checkpoint import CHECKPOINT_NAME

    if (Path(run_dir) / CHECKPOINT_NAME).is_file():
        return f"free space, then `gputui resume {run_dir}` continues from the last checkpoint"
    return "free space on that disk and run it again"


# gloo's and NCCL's words for a collective that waited past its timeout
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms|collective operation timeout", re.I)


def _one_line(exc: BaseException) -> str:
    timeout = _COLLECTIVE_TIMEOUT.search(str(exc))
    if timeout:
        after = f" after {int(timeout.group(1)) / 1000:g} s" if timeout.group(1) else ""
        return (f"a collective timed out{after} (strategy.timeout_s): another rank stopped "
                f"responding; raise strategy.timeout_s if the ranks are only slow")
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    known = type(exc).__name__ in {"DataError", "ConfigError", "ReplicaMismatch", "Diverged",
                                   "OutOfMemory", "CheckpointError", "UserCodeError",
                                   "CompileError"}
    return first if known and first else f"{type(exc).__name__}: {first}".rstrip(": ")


def _cores() -> int:
    """The cores this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def _set_threads(torch, threads: int, processes: int) -> None:
    """Give each process its share of the cores unless run.threads says otherwise."""
    if threads <= 0:
        threads = max(1, _cores() // max(1, processes))
    torch.set_num_threads(threads)


def child_main(spec: dict[str, Any]) -> None:
    """Entry point of the spawned training process (single-process strategies)."""
    # CUDA must number GPUs the way discovery (NVML, PCI order) did, before torch loads CUDA.
    from gputui.telemetry.cuda_order import cuda_env

    os.environ.update(cuda_env())
    queue = spec["queue"]
    stop = StopFlag(spec["stop_event"], spec["parent_pid"], reason_box=spec.get("stop_reason"),
                    signals=True)
    recorder = Recorder(Path(spec["run_dir"]), forward=queue.put)
    devices = [Device(d["kind"], d["index"], d.get("label", "")) for d in spec["devices"]]
    try:
        execute(spec["config"], devices, spec["run_id"], recorder, stop, spec["t_launch"],
                notes=spec.get("notes", ()))
    finally:
        recorder.close()
