"""One run (or one rank's share of it) in this process: :func:`execute`.

The run host calls it for a single-process run, each rank for its share of a multi-process
one. A stop (see ``stopping``) stops it at its next step with a checkpoint; every event goes
to ``emit`` as it happens, and it ends with exactly one terminal event.
"""

from __future__ import annotations

import os
import re
import time
import traceback
from pathlib import Path
from typing import Callable

from gputui.core import ompwait
from gputui.core.config import RunConfig
from gputui.core.devices import Device
from gputui.core.errors import describe
from gputui.core.events import (Event, InitDone, LogLine, RunFailed, RunFinished, RunStarted,
                                RunStopped)
from gputui.core.filewrite import DISK_FULL, WriteFailed, os_error_in
from gputui.core.usercode import code_named
from gputui.train.rankinfo import RankInfo
from gputui.train.stopping import AgreedStop


def execute(cfg: RunConfig, devices: list[Device], run_id: str, emit: Callable[[Event], None],
            run_dir: str | Path, should_stop: Callable[[], bool], t_launch: float,
            rank: RankInfo | None = None, load_data: Callable | None = None,
            notes: list[str] | tuple = ()) -> str:
    """Train one run in this process; returns the terminal status. Never raises. ``rank``
    is given in each process of a multi-process run; ``load_data`` replaces
    ``data.load_from_config`` (the ranks map the copy their host loaded). ``notes`` are the
    launcher's lines for the record (e.g. the devices' fallback), logged after RunStarted."""
    launch_s = time.time() - t_launch  # the spawn, the agent, the interpreter: before this
    run_dir = Path(run_dir)
    started = False
    try:
        from gputui.core import registry

        info = registry.get(cfg.strategy.name)
        assert info is not None, "plan.validate checked the strategy name"

        def start() -> None:
            nonlocal started
            if not started:
                started = True
                emit(RunStarted(run_id=run_id, config=cfg,
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

        from gputui.train import data as data_mod
        from gputui.train import strategies
        from gputui.train.loop import train
        from gputui.train.models import count_params

        import_s = time.perf_counter() - t0
        _set_threads(torch, cfg.run.threads, processes=rank.local_world_size if rank else 1)
        _seed_everything(torch, cfg.run.seed, rank.rank if rank else 0)
        t1 = time.perf_counter()
        ds = (load_data or data_mod.load_from_config)(cfg.data)
        t2 = time.perf_counter()
        where = {"rank": rank.rank, "world_size": rank.world_size} if rank else {}
        strategy = strategies.load(info.name)(cfg, devices, ds.in_channels, ds.image_size,
                                              ds.num_classes, height=ds.height, **where)
        strategy.setup()
        start()
        if rank is not None:
            should_stop = AgreedStop(should_stop, strategy)
        batches = data_mod.make_batches(ds, strategy.batch_size, cfg.run.seed,
                                        strategy.data_device(), cfg.data.loader, cfg.data.workers,
                                        cfg.run.channels_last)
        t3 = time.perf_counter()
        from gputui.train.strategies import fastpath

        compile_s = fastpath.compile_ahead(strategy, ds, emit)  # before the first step, timed apart
        for note in strategy.notes:
            emit(LogLine(level="info", message=note))
        if ds.source:
            emit(LogLine(level="info", message=f"text: {ds.source}; unigram baseline "
                                               f"{ds.baseline:.3f} nats per byte"))
        emit(InitDone(seconds=time.time() - t_launch, import_s=import_s, data_s=t2 - t1,
                      model_s=t3 - t2, compile_s=compile_s, train_samples=ds.n_train,
                      test_samples=ds.n_test, steps_per_epoch=batches.steps_per_epoch,
                      params=count_params(strategy.primary_model()),
                      threads=torch.get_num_threads(), cores=_cores(),
                      omp_wait=ompwait.described(), task=strategy.task,
                      tokens_per_sample=ds.image_size if strategy.task == "lm" else 0,
                      baseline_loss=ds.baseline, launch_s=launch_s))
        t_train = time.time()
        status = train(cfg, strategy, batches, ds, emit, should_stop, run_dir=run_dir)
        strategy.close()
        if status == "stopped":
            emit(RunStopped(reason=getattr(should_stop, "reason", "stopped by user")))
        else:
            emit(RunFinished(seconds=time.time() - t_train))
        return status
    except WriteFailed as exc:  # a full disk or a refused write: one line, no traceback
        if exc.disk_full:
            exc.hint = disk_hint(run_dir, run_id)
        emit(RunFailed(reason=str(exc)))
        return "failed"
    except Exception as exc:  # noqa: BLE001 - every failure must end the record
        cause = os_error_in(exc) if not isinstance(exc, OSError) else None
        if cause is not None and cause.errno in DISK_FULL:  # e.g. a user's code writing files
            emit(RunFailed(reason=f"{_one_line(exc)}: {cause.strerror} "
                                  f"({disk_hint(run_dir, run_id)})"))
            return "failed"
        emit(RunFailed(reason=_one_line(exc), detail=traceback.format_exc()))
        return "failed"


def disk_hint(run_dir: Path, run_id: str = "") -> str:
    """What to do after a full disk ended a run: resume when a checkpoint was written."""
    from gputui.train.checkpoint import CHECKPOINT_NAME

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
    return describe(exc)


def _cores() -> int:
    """The cores this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def _seed_everything(torch, seed: int, rank: int) -> None:
    """Seed this process's global generators (torch on every device, random, numpy) from
    run.seed and the rank, so every draw a model makes outside gputui's own seeded generators
    (dropout masks, a user's augmentation) repeats with the seed; each rank its own stream."""
    import random

    value = (seed * 1_000_003 + rank) % 2**32
    torch.manual_seed(value)
    random.seed(value)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(value)


def _set_threads(torch, threads: int, processes: int) -> None:
    """Give each process its share of the cores unless run.threads says otherwise."""
    if threads <= 0:
        threads = max(1, _cores() // max(1, processes))
    torch.set_num_threads(threads)
