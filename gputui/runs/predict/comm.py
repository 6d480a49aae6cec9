"""The allreduce as DDP issues it, timed for the prediction (torch is imported in spawned
processes only).

``gputui bench-comm`` times back-to-back calls, which keeps gloo's threads awake; a training
step instead computes, then all-reduces its gradients once. Here each rank (the threads a
rank gets) does a fixed amount of compute that takes about ``gap`` seconds, then one
all_reduce of ``size`` bytes, and so on: the figure is the mean cycle (compute and all-reduce)
less the slowest rank's mean compute, which is what the all-reduce adds to a step, the wait
for a rank held up by the other processes on its cores included. Gradients above DDP's first bucket
(1 MiB) are reduced while backward still runs on every core, so for those one spinning
process per core keeps the cores busy during the whole measurement, as training does (on
busy cores a gloo all-reduce can take twice what it takes on idle ones, and a small one takes
longer between compute than back to back).

fsdp (``fully_shard``) issues no all-reduce but one collective per unit and pass: a unit's
all-gather before its forward, again before its backward (every unit but the root reshards
after forward), and a reduce-scatter of its gradients after its backward, each of the unit's
flat (padded) parameter bytes. :func:`fsdp_calls` lists them in a step's order from the
units' sizes (counted from the model itself, the way the fsdp strategy wraps it:
:func:`fsdp_units`), and :func:`fsdp_in_step` times that sequence between ranks with the
step's compute cut into equal slices between the calls: on the CPU gloo runs each call on the
training thread, so each pays its latency and waits for the slower rank, as in training.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import subprocess
import sys
import time
import uuid
from typing import Any

from gputui.core.devices import backend_for
from gputui.core.errors import fault_line

FIRST_BUCKET = 2**20  # DDP's first bucket: a gradient this small is one call after backward
_SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


Call = tuple[str, int]  # ("all_gather" | "reduce_scatter", the unit's full flat bytes)


def fsdp_calls(units: list[int], root: int = 0) -> list[Call]:
    """One step's fsdp collectives in the order fully_shard issues them: ``units`` are the
    flat parameter bytes of each wrapped unit in forward order, ``root`` those of the whole
    model's own unit (parameters in no wrapped unit; 0: none, so no collective). Forward
    all-gathers the root, then each unit; backward, in reverse, all-gathers each unit again
    (resharded after forward) and reduce-scatters its gradients; the root (kept gathered
    after forward) reduce-scatters last."""
    calls: list[Call] = [("all_gather", root)] if root else []
    calls += [("all_gather", b) for b in units if b]
    for b in reversed(units):
        if b:
            calls += [("all_gather", b), ("reduce_scatter", b)]
    if root:
        calls.append(("reduce_scatter", root))
    return calls


def padded_bytes(shapes: list[tuple[int, ...]], n: int, itemsize: int = 4) -> int:
    """The flat bytes of one fsdp unit on ``n`` ranks: each parameter is sharded on its first
    dimension (a scalar: one row), padded to a multiple of ``n`` rows."""
    total = 0
    for shape in shapes:
        rows = shape[0] if shape else 1
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += -(-rows // n) * n * rest
    return total * itemsize


def fsdp_units(cfg_dict: dict, n: int) -> tuple[list[int], int]:
    """The padded flat bytes of each unit the fsdp strategy wraps (forward order) and of the
    root's own parameters, for ``n`` ranks: the configured model built here (torch)."""
    from gputui.core.config import from_dict
    from gputui.core.devices import Device
    from gputui.train import data as data_mod
    from gputui.train.parallelize import fsdp_targets
    from gputui.train.strategies.rank import RankStrategy

    small = {**cfg_dict, "data": {**cfg_dict.get("data", {}), "train_size": 64,
                                  "test_size": 64}}  # the shapes only
    cfg = from_dict(small)
    ds = data_mod.load_from_config(cfg.data)
    strategy = RankStrategy(cfg, [Device("cpu", 0)], ds.in_channels, ds.image_size,
                            ds.num_classes, height=ds.height)
    model = strategy.build_model()
    names = list(cfg.strategy.fsdp_wrap)
    targets = fsdp_targets(model, names)  # innermost first: a unit owns what no inner one does
    seen: set[int] = set()
    owned = []
    for t in targets:
        ps = [p for p in t.parameters() if id(p) not in seen]
        seen.update(id(p) for p in ps)
        owned.append(padded_bytes([tuple(p.shape) for p in ps], n,
                                  ps[0].element_size() if ps else 4))
    units = owned[::-1] if names else owned  # forward order (named: modules() reversed)
    rest = [p for p in model.parameters() if id(p) not in seen]
    root = padded_bytes([tuple(p.shape) for p in rest], n, rest[0].element_size()) if rest else 0
    return units, root


def _rank(size: int, gap: float, iters: int, threads: int, kind: str,
          calls: list[Call] | None = None) -> float:
    import torch
    import torch.distributed as dist

    from gputui.core import signals

    signals.rank_of_held()
    torch.set_num_threads(threads)
    from gputui.train.rankinfo import RankInfo

    local = RankInfo.of_process(1).local_rank
    device = torch.device(f"cuda:{local}" if kind == "cuda" else "cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for("auto", kind))
    try:
        grad = torch.ones(max(1, size // 4), device=device)
        work = torch.randn(128, 128, device=device)
        k = _calibrate(work, gap, kind, device)
        if calls:
            return _fsdp_cycles(calls, work, k, iters, device)
        cycles, works = [], []
        for i in range(iters + 3):
            t0 = time.perf_counter()
            for _ in range(k):  # the step's compute: a fixed amount of work on this rank's
                work @ work     # threads, so a rank held up takes longer, as in training
            if kind == "cuda":
                torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            # as DDP's default comm hook issues a bucket: averaged, asynchronous, its result
            # taken in a callback on the collective's thread, waited for by the step
            grad.div_(dist.get_world_size())
            fut = dist.all_reduce(grad, async_op=True).get_future().then(lambda f: f.value())
            fut.wait()
            if kind == "cuda":
                torch.cuda.synchronize(device)
            if i >= 3:
                cycles.append(time.perf_counter() - t0)
                works.append(t1 - t0)
        return _added(cycles, works)
    finally:
        time.sleep(0.1)  # see strategies.rank.destroy_group
        dist.destroy_process_group()


def _fsdp_cycles(calls: list[Call], work, k: int, iters: int, device) -> float:
    """fsdp's step: the compute (``k`` matmuls) cut into equal slices, one before each
    collective, as fully_shard issues them on the CPU (synchronous; on CUDA each slice and
    each call is synchronized, so the figure is the work, not its queueing); what they add to
    a step, as for the all-reduce: the mean cycle less the slowest rank's mean compute."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n = dist.get_world_size()
    bufs = []
    for op, b in calls:
        numel = max(n, b // 4 // n * n)
        bufs.append((op, numel, torch.ones(numel, device=device),
                     torch.ones(numel // n, device=device)))
    cuts = [round(k * (i + 1) / len(calls)) - round(k * i / len(calls))
            for i in range(len(calls))]
    cycles, works = [], []
    for i in range(iters + 3):
        t0 = time.perf_counter()
        busy = 0.0
        for (op, numel, full, shard), cut in zip(bufs, cuts, strict=True):
            w0 = time.perf_counter()
            for _ in range(cut):
                work @ work
            sync()
            busy += time.perf_counter() - w0
            # with fsdp's own copies around each call, into buffers allocated per call as it
            # allocates them (on the CPU, fresh pages: part of the cost)
            if op == "all_gather":  # copy-in of the shards, gather, copy-out into the
                inp = torch.empty(numel // n, device=device)  # unsharded parameters
                inp.copy_(shard)
                out = torch.empty(numel, device=device)
                dist.all_gather_single(out, inp)  # as torch's DefaultAllGather
                torch.empty(numel, device=device).copy_(out)
            else:  # the gradients copied into one input, divided before and after (gloo
                inp = torch.empty(numel, device=device)  # has no average), scattered
                inp.copy_(full).div_(n)
                out = torch.empty(numel // n, device=device)
                dist.reduce_scatter_single(output=out, input=inp)  # as DefaultReduceScatter
                shard.copy_(out)
            sync()
        if i >= 3:
            cycles.append(time.perf_counter() - t0)
            works.append(busy)
    return _added(cycles, works)


def _added(cycles: list[float], works: list[float]) -> float:
    """What the collectives add to a step: the mean cycle (the same on every rank: they wait
    for each other) less the slowest rank's mean compute, so the wait for a rank held up (the
    other processes on its cores) counts, as it does in training."""
    import torch
    import torch.distributed as dist

    figures = torch.tensor([sum(cycles) / len(cycles), sum(works) / len(works)],
                           dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    dist.barrier()
    return max(0.0, float(figures[0] - figures[1]))


def _calibrate(work, gap: float, kind: str, device) -> int:
    """How many ``work @ work`` take about ``gap`` seconds on this rank."""
    import torch

    n, took = 1, 0.0
    while took < 0.02 and n < 2**20:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            work @ work
        if kind == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - t0
    return max(1, round(gap / (took / n)))


def _driver(n: int, size: int, gap: float, iters: int, threads: int, kind: str, q,
            cfg_dict: dict | None = None) -> None:
    import logging

    from gputui.core import signals

    signals.hold()  # the parent decides on a stop signal: it ends this process and its ranks
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n,
                              run_id=f"predict-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                              rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                              start_method="spawn", monitor_interval=0.1)
        calls = None
        if cfg_dict is not None:  # fsdp: the model's units, counted here
            calls = fsdp_calls(*fsdp_units(cfg_dict, n))
            size = sum(b for _, b in calls)
        out = elastic_launch(config, _rank)(size, gap, iters, threads, kind, calls)
        q.put({"seconds": out[0], "calls": len(calls or [1]), "bytes": size})
    except Exception as exc:  # noqa: BLE001 - one line for the parent
        q.put({"error": fault_line(exc)})


def allreduce_in_step(n: int, size: int, gap: float, kind: str, cores: int,
                      timeout: float = 600.0) -> float:
    """Seconds of one all_reduce of ``size`` bytes over ``n`` ranks between ``gap`` seconds of
    compute (cores kept busy for sizes above DDP's first bucket, on the CPU); raises
    RuntimeError (one line) on failure. No process outlives the call."""
    return _measure(n, size, gap, kind, cores, timeout)["seconds"]


def fsdp_in_step(cfg_dict: dict, n: int, gap: float, kind: str, cores: int,
                 timeout: float = 600.0) -> dict:
    """Seconds that one step's fsdp collectives (:func:`fsdp_calls` of the configured model's
    units) add to a step of ``gap`` seconds of compute over ``n`` ranks, with their count
    (``calls``) and total bytes (``bytes``); raises RuntimeError (one line) on failure. No
    process outlives the call."""
    return _measure(n, 0, gap, kind, cores, timeout, cfg_dict)


def _measure(n: int, size: int, gap: float, kind: str, cores: int, timeout: float,
             cfg_dict: dict | None = None) -> dict:
    threads = max(1, cores // n) if kind == "cpu" else 1
    # about 2 s of steps: short steps swing, and one slow call weighs on a short mean
    iters = max(5, min(300, int(2.0 / max(gap, 1e-3))))
    busy = cores if kind == "cpu" and size > FIRST_BUCKET and cfg_dict is None else 0
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(timeout)])
                for _ in range(busy)]
    from gputui.core import ompwait, signals
    from gputui.core.proctree import own_tracker

    own_tracker()  # before the queue: starting the tracker would unblock the signals
    ompwait.for_children()  # as a run's ranks wait (before the child loads torch)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_driver, args=(n, size, gap, iters, threads, kind, q, cfg_dict),
                       name="gputui-predict-comm")
    with signals.deferred():  # held from its birth: never a traceback in its imports
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            signals.raise_if_stopped()  # a stop signal: the measurement ends here, unkept
            try:
                result: dict[str, Any] = q.get(timeout=0.5)
                break
            except queue_mod.Empty:
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(
                        "the allreduce measurement ended without a result") from None
    except signals.Interrupted:
        from gputui.core.proctree import kill_tree

        kill_tree(proc.pid)  # no waiting for the ranks to finish
        raise
    finally:
        from gputui.core.proctree import kill_tree

        proc.join(timeout=10)
        if proc.is_alive():
            kill_tree(proc.pid)
            proc.join(timeout=5)
        for s in spinners:
            s.kill()
            s.wait()
    signals.raise_if_stopped()  # a result that a signal cut short is no result
    if "error" in result:
        what = "fsdp collectives" if cfg_dict is not None else "allreduce"
        raise RuntimeError(f"{what} measurement failed: {result['error']}")
    return result
