"""The measuring side of timed collectives (imports torch; runs only in spawned processes):
`gputui bench-comm` and the prediction's collectives in a step.

``driver`` runs in a child of the CLI (``gputui.runs.comm_bench.comm_main``), and
:func:`launch_ranks` is the one rank launcher for both: one rank per device through torch's
elastic launcher (the engine of torchrun). For bench-comm (``"bench"``) the driver times the
scratch allreduce (distinct replicas, one per device, summed on the first and copied back) in
its own process, then ``torch.distributed.all_reduce`` in each rank: every size is checked for
a correct sum first, then timed over ``iters`` calls after ``warmup`` calls; times are per
call, the distributed time the slowest rank's. For the prediction (``"in_step"``, see
``gputui.runs.predict.measure``) each rank computes, then issues the step's collectives, as
training does.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import uuid
from typing import Any, Callable

import torch
import torch.distributed as dist

from gputui.core import signals
from gputui.core.config import from_dict
from gputui.core.devices import Device, backend_for
from gputui.core.errors import fault_line
from gputui.train import data as data_mod
from gputui.train.parallelize import fsdp_targets
from gputui.train.rankinfo import RankInfo
from gputui.train.strategies.rank import RankStrategy, destroy_group
from gputui.train.strategies.scratch import allreduce

DTYPE = torch.float32


def _sync(devices: list[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def _expect(n: int) -> float:
    return n * (n + 1) / 2  # ranks fill 1..n, so every element sums to this


def bench_scratch(torch_devices: list[str], sizes: list[int], iters: int,
                  warmup: int, repeats: int = 1) -> list[dict[str, Any]]:
    """Seconds per call of the scratch ``allreduce`` over ``len(torch_devices)`` replicas,
    ``repeats`` times (``samples``; ``seconds`` is their median)."""
    devices = [torch.device(d) for d in torch_devices]
    n, out = len(devices), []
    for size in sizes:
        count = max(1, size // DTYPE.itemsize)
        # zeros + fill, never .to(): replicas on one physical device must not alias.
        data = [torch.zeros(count, dtype=DTYPE, device=d).fill_(i + 1)
                for i, d in enumerate(devices)]
        allreduce(data)
        _sync(devices)
        if not all(torch.all(t == _expect(n)).item() for t in data):
            raise RuntimeError(f"scratch allreduce gave a wrong sum at {size} bytes")
        for t in data:
            t.zero_()  # timed calls on zeros: repeated sums of ones would overflow to inf
        for _ in range(warmup):
            allreduce(data)
        _sync(devices)
        samples = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            for _ in range(iters):
                allreduce(data)
            _sync(devices)
            samples.append((time.perf_counter() - t0) / iters)
        out.append({"size": count * DTYPE.itemsize, "count": count,
                    "seconds": _median(samples), "samples": samples})
    return out


def _median(values: list[float]) -> float:
    vals = sorted(values)
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def rank_main(sizes: list[int], iters: int, warmup: int, kind: str, indices: list[int],
              backend: str, threads: int, repeats: int = 1) -> list[dict[str, Any]] | None:
    """One rank: time all_reduce over every size; rank 0 returns the results."""
    signals.rank_of_held()
    me = RankInfo.of_process(len(indices))
    rank, local, world = me.rank, me.local_rank, me.world_size
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    if kind == "cuda":
        device = torch.device(f"cuda:{indices[local]}")
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    try:
        results = []
        for size in sizes:
            count = max(1, size // DTYPE.itemsize)
            t = torch.full((count,), float(rank + 1), dtype=DTYPE, device=device)
            dist.all_reduce(t)
            if not torch.all(t == _expect(world)).item():
                raise RuntimeError(f"all_reduce gave a wrong sum at {size} bytes")
            t.zero_()
            for _ in range(warmup):
                dist.all_reduce(t)
            _sync([device])
            samples = []
            for _ in range(max(1, repeats)):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t)
                _sync([device])
                took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64,
                                    device=device)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
                samples.append(took.item())
            results.append({"size": count * DTYPE.itemsize, "count": count,
                            "seconds": _median(samples), "samples": samples})
        dist.barrier()  # no rank tears down while another is still in a collective
        return results if rank == 0 else None
    finally:
        dist.destroy_process_group()


def launch_ranks(fn: Callable[..., Any], n: int, args: tuple, tag: str) -> dict[int, Any]:
    """``fn(*args)`` in ``n`` ranks on this node through elastic_launch (c10d rendezvous on a
    free local port, no restart); what each rank returned, by rank. Called in the driver."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)  # keep the measurement's output clean
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n,
                          run_id=f"{tag}-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, start_method="spawn",
                          monitor_interval=0.1)
    return elastic_launch(config, fn)(*args)


def bench_dist(kind: str, indices: list[int], sizes: list[int], iters: int, warmup: int,
               backend: str, repeats: int = 1) -> list[dict[str, Any]]:
    """One rank per device, all_reduce timed in each (rank 0's results)."""
    n = len(indices)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // n)
    results = launch_ranks(rank_main, n, (sizes, iters, warmup, kind, indices, backend, threads,
                                          repeats), "bench")
    return results[0]


def driver(job: dict[str, Any], queue) -> None:
    """Entry point of the spawned measuring process: puts one result dict on ``queue``
    (``{"error", "detail"}`` when it failed). ``job["what"]``: ``"bench"`` (bench-comm's
    sizes) or ``"in_step"`` (the prediction's collectives between compute)."""
    signals.hold()  # the parent decides on a stop signal: it ends this process and its ranks
    out: dict[str, Any] = {}
    try:
        out = bench(job) if job["what"] == "bench" else in_step(job)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        out["error"] = fault_line(exc)
        out["detail"] = traceback.format_exc()
    queue.put(out)


def bench(spec: dict[str, Any]) -> dict[str, Any]:
    """bench-comm's rows: the scratch allreduce in this process, torch's in one rank a device."""
    out: dict[str, Any] = {}
    kind, indices = spec["kind"], spec["indices"]
    sizes, iters, warmup = spec["sizes"], spec["iters"], spec["warmup"]
    if "scratch" in spec["impls"]:
        devs = ["cpu" if kind == "cpu" else f"cuda:{i}" for i in indices]
        out["scratch"] = bench_scratch(devs, sizes, iters, warmup, spec.get("repeats", 1))
    if "torch" in spec["impls"]:
        out["torch"] = bench_dist(kind, indices, sizes, iters, warmup, spec["backend"],
                                  spec.get("repeats", 1))
    return out


# ------------------------------------------------------------- the prediction's collectives

Call = tuple[str, int]  # ("all_gather" | "reduce_scatter", the unit's full flat bytes)
# a plan's collective: (op, the full bytes of one call, its group's size); op one of OPS
GroupCall = tuple[str, int, int]
OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "ring")


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


def step_rank(size: int, gap: float, iters: int, threads: int, kind: str,
          calls: list[Call] | None = None) -> float:
    signals.rank_of_held()
    torch.set_num_threads(threads)
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
        destroy_group()


def _fsdp_cycles(calls: list[Call], work, k: int, iters: int, device) -> float:
    """fsdp's step: the compute (``k`` matmuls) cut into equal slices, one before each
    collective, as fully_shard issues them on the CPU (synchronous; on CUDA each slice and
    each call is synchronized, so the figure is the work, not its queueing); what they add to
    a step, as for the all-reduce: the mean cycle less the slowest rank's mean compute."""
    n = dist.get_world_size()
    return _cycles([(op, b, n) for op, b in calls], work, k, iters, device, {n: None})


def _cycles(calls: list[GroupCall], work, k: int, iters: int, device,
            groups: dict[int, Any]) -> float:
    """:func:`_fsdp_cycles` over calls of any op of :data:`OPS`, each in this rank's group of
    its size (``groups``: size -> group; None: the whole world)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    bufs = []
    held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for op, b, size in calls:
        n = max(1, size)
        numel = max(n, b // 4 // n * n)
        if op == "broadcast":  # ZeRO-1's: into each parameter, a tensor of its own each
            own = torch.ones(numel, device=device)
            bufs.append((op, numel, n, groups.get(size), own, own))
            continue
        # one full buffer and one shard per size, shared by the calls of that size (a
        # model's units are of a few sizes): the rank holds what one call needs, not the
        # whole step's
        full, shard = held.setdefault((numel, n), (torch.ones(numel, device=device),
                                                   torch.ones(numel // n, device=device)))
        bufs.append((op, numel, n, groups.get(size), full, shard))
    cuts = [round(k * (i + 1) / len(calls)) - round(k * i / len(calls))
            for i in range(len(calls))]
    together, cuts = _together([b[0] for b in bufs], cuts)
    srcs = _sources(together, [b[2] for b in bufs])
    cycles, works = [], []
    for i in range(iters + 3):
        t0 = time.perf_counter()
        busy = 0.0
        pending: list[Any] = []
        for j, ((op, numel, n, group, full, shard), cut) in enumerate(
                zip(bufs, cuts, strict=True)):
            w0 = time.perf_counter()
            for _ in range(cut):
                work @ work
            sync()
            busy += time.perf_counter() - w0
            if op == "broadcast":  # issued with the rest of its run, then all waited for
                pending.append(_call(op, numel, n, group, full, shard, device, srcs[j],
                                     async_op=True))
                if j + 1 < len(bufs) and together[j + 1]:
                    continue
                for handle in pending:
                    handle.wait()
                pending.clear()
            else:
                _call(op, numel, n, group, full, shard, device)
            sync()
        if i >= 3:
            cycles.append(time.perf_counter() - t0)
            works.append(busy)
    return _added(cycles, works)


def _together(ops: list[str], cuts: list[int]) -> tuple[list[bool], list[int]]:
    """Which calls are issued with the one before them, and the compute slices before each:
    ZeRO-1's broadcasts come together (ZeroRedundancyOptimizer issues one a parameter,
    asynchronously, once the update is done, then waits for them all), so a run of them
    takes its compute slices first, none between its calls."""
    together = [op == "broadcast" and j > 0 and ops[j - 1] == "broadcast"
                for j, op in enumerate(ops)]
    cuts = list(cuts)
    for j in range(len(ops) - 1, 0, -1):
        if together[j]:
            cuts[j - 1] += cuts[j]
            cuts[j] = 0
    return together, cuts


def _sources(together: list[bool], sizes: list[int]) -> list[int]:
    """The group rank each call of a run (:func:`_together`) is broadcast from: each rank in
    turn, an equal share of the run each, as ZeroRedundancyOptimizer broadcasts each rank's
    partition of the parameters, rank by rank (0 for a call on its own)."""
    srcs = [0] * len(together)
    start = 0
    while start < len(together):
        end = start + 1
        while end < len(together) and together[end]:
            end += 1
        for j in range(start, end):
            srcs[j] = (j - start) * sizes[j] // (end - start)
        start = end
    return srcs


def _single(kind: str, before: str) -> Any:
    """torch's collective into one tensor as fully_shard's DefaultAllGather and
    DefaultReduceScatter call it: ``dist.<kind>_single`` (torch 2.13), ``dist.<before>`` where
    torch lacks that (2.11, the oldest gputui supports: the same arguments; 2.13 keeps it,
    deprecated)."""
    return getattr(dist, f"{kind}_single", None) or getattr(dist, before)


def _call(op: str, numel: int, n: int, group: Any, full: torch.Tensor, shard: torch.Tensor,
          device: torch.device, src: int = 0, async_op: bool = False) -> Any:
    """One collective of ``op`` over ``group`` (of ``n`` ranks) as the parallelism code issues
    it. fsdp's with its own copies around each call, into buffers allocated per call as it
    allocates them (on the CPU, fresh pages: part of the cost). A broadcast is from the
    group's rank ``src`` and may be asynchronous (its handle returned: ``async_op``)."""
    if op == "all_gather":  # copy-in of the shards, gather, copy-out into the
        inp = torch.empty(numel // n, device=device)  # unsharded parameters
        inp.copy_(shard)
        out = torch.empty(numel, device=device)
        _single("all_gather", "all_gather_into_tensor")(out, inp, group=group)  # as fsdp's
        torch.empty(numel, device=device).copy_(out)
    elif op == "reduce_scatter":  # the gradients copied into one input, divided before and
        inp = torch.empty(numel, device=device)  # after (gloo has no average), scattered
        inp.copy_(full).div_(n)
        out = torch.empty(numel // n, device=device)
        _single("reduce_scatter", "reduce_scatter_tensor")(output=out, input=inp, group=group)
        shard.copy_(out)
    elif op == "all_reduce":  # tp's partial sums, DDP's buckets: in place
        dist.all_reduce(full, group=group)
    elif op == "all_to_all":  # ep's tokens, an even split
        dist.all_to_all_single(torch.empty_like(full), full, group=group)
    elif op == "broadcast":  # ZeRO-1's updated parameters (a run of them: see _cycles)
        return dist.broadcast(full, src=dist.get_global_rank(group, src) if group else src,
                              group=group, async_op=async_op)
    elif op == "ring":  # cp's hop: a block sent to the next rank, one taken from the last
        rank = dist.get_rank(group) if group else dist.get_rank()
        peer = (lambda r: dist.get_global_rank(group, r)) if group else (lambda r: r)
        recv = torch.empty_like(full)
        for req in dist.batch_isend_irecv([
                dist.P2POp(dist.isend, full, peer((rank + 1) % n), group),
                dist.P2POp(dist.irecv, recv, peer((rank - 1) % n), group)]):
            req.wait()
    else:
        raise ValueError(f"no collective {op!r} (one of {', '.join(OPS)})")


def meshes_rank(meshes: list[dict[str, Any]], threads: int, kind: str) -> list[float] | None:
    """A plan's meshes on CPU ranks (``gputui.runs.forecast.links``): for each, what its
    collectives (``calls``: op, bytes, group size) add to a step of ``gap`` seconds of
    compute, over ``iters`` steps; rank 0's list, in order.
    A group size that does not divide the world has no group: its calls are left out (the
    plan leaves them to the formula)."""
    signals.rank_of_held()
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    dist.init_process_group(backend_for("auto", kind))
    try:
        world = dist.get_world_size()
        groups: dict[int, Any] = {world: None}
        for size in sorted({int(c[2]) for m in meshes for c in m["calls"]}):
            if size not in groups and 1 < size < world and world % size == 0:
                groups[size], _ = dist.new_subgroups(size)  # consecutive ranks
        work = torch.randn(128, 128, device=device)
        out = []
        for m in meshes:
            calls = [(str(op), int(b), int(g)) for op, b, g in m["calls"] if int(g) in groups]
            k = _calibrate(work, m["gap"], kind, device)
            out.append(_cycles(calls, work, k, int(m["iters"]), device, groups) if calls
                       else 0.0)
        return out if dist.get_rank() == 0 else None
    finally:
        destroy_group()


def _added(cycles: list[float], works: list[float]) -> float:
    """What the collectives add to a step: the mean cycle (the same on every rank: they wait
    for each other) less the slowest rank's mean compute, so the wait for a rank held up (the
    other processes on its cores) counts, as it does in training."""
    figures = torch.tensor([sum(cycles) / len(cycles), sum(works) / len(works)],
                           dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    dist.barrier()
    return max(0.0, float(figures[0] - figures[1]))


def _calibrate(work, gap: float, kind: str, device) -> int:
    """How many ``work @ work`` take about ``gap`` seconds on this rank."""
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


def in_step(job: dict[str, Any]) -> dict[str, Any]:
    """The prediction's figure: what one all-reduce of ``size`` bytes (or, given a config,
    the model's fsdp collectives) adds to a step of ``gap`` seconds of compute on ``n`` ranks."""
    n, size, calls = job["n"], job["size"], None
    if job.get("meshes") is not None:  # a plan's: each mesh's calls between its compute
        got = launch_ranks(meshes_rank, n, (job["meshes"], job["threads"], job["kind"]),
                           "plan")
        return {"seconds": got[0]}
    if job.get("cfg") is not None:  # fsdp: the model's units, counted here
        calls = fsdp_calls(*fsdp_units(job["cfg"], n))
        size = sum(b for _, b in calls)
    out = launch_ranks(step_rank, n, (size, job["gap"], job["iters"], job["threads"],
                                      job["kind"], calls), "predict")
    return {"seconds": out[0], "calls": len(calls or [1]), "bytes": size}
