"""The measuring side of `gputui bench-comm` (imports torch; runs only in spawned processes).

``driver`` runs in a child of the CLI: it times the scratch allreduce (distinct replicas, one
per device, summed on the first and copied back) in its own process, then launches one rank
per device with torch's elastic launcher (the engine of torchrun) and times
``torch.distributed.all_reduce`` in each. Every size is checked for a correct sum first, then
timed over ``iters`` calls after ``warmup`` calls. Times are per call; the distributed time is
the slowest rank's.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import uuid
from typing import Any

import torch

from gputui.core.errors import fault_line
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
    import torch.distributed as dist

    from gputui.core import signals

    signals.rank_of_held()

    from gputui.train.rankinfo import RankInfo

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


def bench_dist(kind: str, indices: list[int], sizes: list[int], iters: int, warmup: int,
               backend: str, repeats: int = 1) -> list[dict[str, Any]]:
    """One rank per device through elastic_launch (c10d rendezvous on a free local port)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    n = len(indices)
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)  # keep the benchmark output clean
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // n)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n,
                          run_id=f"bench-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, start_method="spawn",
                          monitor_interval=0.1)
    results = elastic_launch(config, rank_main)(sizes, iters, warmup, kind, indices, backend,
                                                threads, repeats)
    return results[0]


def driver(spec: dict[str, Any], queue) -> None:
    """Entry point of the spawned benchmark process: puts one result dict on ``queue``."""
    from gputui.core import signals

    signals.hold()  # the parent decides on a stop signal: it ends this process and its ranks
    out: dict[str, Any] = {}
    try:
        kind, indices = spec["kind"], spec["indices"]
        sizes, iters, warmup = spec["sizes"], spec["iters"], spec["warmup"]
        if "scratch" in spec["impls"]:
            devs = ["cpu" if kind == "cpu" else f"cuda:{i}" for i in indices]
            out["scratch"] = bench_scratch(devs, sizes, iters, warmup, spec.get("repeats", 1))
        if "torch" in spec["impls"]:
            out["torch"] = bench_dist(kind, indices, sizes, iters, warmup, spec["backend"],
                                      spec.get("repeats", 1))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        out["error"] = fault_line(exc)
        out["detail"] = traceback.format_exc()
    queue.put(out)
