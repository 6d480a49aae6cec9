"""The allreduce as DDP issues it, timed for the prediction (torch is imported in spawned
processes only).

``gputui bench-comm`` times back-to-back calls, which keeps gloo's threads awake; a training
step instead computes, then all-reduces its gradients once. Here each rank (the threads a
rank gets) does a fixed amount of compute that takes about ``gap`` seconds, then one
all_reduce of ``size`` bytes, and so on: the figure is the mean cycle (compute and all-reduce)
less the slowest rank's mean compute, which is what the all-reduce adds to a step, the wait
for a rank held up by the other processes on its cores included. Gradients above DDP's first bucket
(1 MiB) are reduced while backward still runs on every core, so for those one spinning
process per core keeps the cores busy during the whole measurement, as training does
(measured here: 42 MiB over two gloo ranks took 28 ms on 2 idle cores, 61 ms on 2 busy
ones; 0.5 MiB took 1.9 ms back to back and 3.3 ms between 28 ms of compute).
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import subprocess
import sys
import time
import uuid
from typing import Any

FIRST_BUCKET = 2**20  # DDP's first bucket: a gradient this small is one call after backward
_SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


def _rank(size: int, gap: float, iters: int, threads: int, kind: str) -> float:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    from gputui.train.rankinfo import RankInfo

    local = RankInfo.of_process(1).local_rank
    device = torch.device(f"cuda:{local}" if kind == "cuda" else "cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    try:
        grad = torch.ones(max(1, size // 4), device=device)
        work = torch.randn(128, 128, device=device)
        k = _calibrate(work, gap, kind, device)
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
        # what the all-reduce adds to a step: the cycle (the same on every rank: they wait for
        # each other) less the slowest rank's own compute, so the wait for a rank held up
        # (the other processes on its cores) counts, as it does in training
        figures = torch.tensor([sum(cycles) / len(cycles), sum(works) / len(works)],
                               dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        dist.barrier()
        return max(0.0, float(figures[0] - figures[1]))
    finally:
        time.sleep(0.1)  # see strategies.ddp.destroy_group
        dist.destroy_process_group()


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


def _driver(n: int, size: int, gap: float, iters: int, threads: int, kind: str, q) -> None:
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n,
                              run_id=f"predict-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                              rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                              start_method="spawn", monitor_interval=0.1)
        out = elastic_launch(config, _rank)(size, gap, iters, threads, kind)
        q.put({"seconds": out[0]})
    except Exception as exc:  # noqa: BLE001 - one line for the parent
        q.put({"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0:1]}"})


def allreduce_in_step(n: int, size: int, gap: float, kind: str, cores: int,
                      timeout: float = 600.0) -> float:
    """Seconds of one all_reduce of ``size`` bytes over ``n`` ranks between ``gap`` seconds of
    compute (cores kept busy for sizes above DDP's first bucket, on the CPU); raises
    RuntimeError (one line) on failure. No process outlives the call."""
    threads = max(1, cores // n) if kind == "cpu" else 1
    # about 2 s of steps: short steps swing, and one slow call weighs on a short mean
    iters = max(5, min(300, int(2.0 / max(gap, 1e-3))))
    busy = cores if kind == "cpu" and size > FIRST_BUCKET else 0
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(timeout)])
                for _ in range(busy)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_driver, args=(n, size, gap, iters, threads, kind, q),
                       name="gputui-predict-comm")
    proc.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                result: dict[str, Any] = q.get(timeout=0.5)
                break
            except queue_mod.Empty:
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the allreduce measurement ended without a result")
    finally:
        from gputui.core.proctree import kill_tree

        proc.join(timeout=10)
        if proc.is_alive():
            kill_tree(proc.pid)
            proc.join(timeout=5)
        for s in spinners:
            s.kill()
            s.wait()
    if "error" in result:
        raise RuntimeError(f"allreduce measurement failed: {result['error']}")
    return result["seconds"]
