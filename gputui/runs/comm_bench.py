"""Allreduce bandwidth, nccl-tests style: the measurement behind `gputui bench-comm`
(:mod:`gputui.cli.bench_comm`) and the prediction's measured bandwidth.

For each message size it measures the time per call, the algorithm bandwidth
(algbw = bytes / time) and the bus bandwidth (busbw = algbw * 2(n-1)/n, the traffic each link
carries in a ring allreduce, so figures compare across device counts), for the scratch
allreduce (replicas in one process) and for torch.distributed (one process per device: gloo
on CPU, nccl on CUDA). Each size is timed ``repeats`` times (``iters`` calls each): the
figures are the median, with the min, the max and the spread ((max - min) / median) beside
them, and the result carries the machine's state while it ran (``machine``, see
:mod:`gputui.hw.contention`). The measuring runs in a spawned process
(:mod:`gputui.train.comm_bench_ranks`); this module never imports torch.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
from typing import Any

from gputui.core import signals
from gputui.core.devices import backend_for
from gputui.core.proctree import kill_tree


def bandwidths(size: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes, as nccl-tests): busbw = algbw * 2(n-1)/n."""
    algbw = size / seconds / 1e9
    return algbw, algbw * 2 * (n - 1) / n


def with_bandwidths(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Adds time_us, algbw_gbps and busbw_gbps to each measured row."""
    out = []
    for r in rows:
        algbw, busbw = bandwidths(r["size"], r["seconds"], n)
        samples = r.get("samples") or [r["seconds"]]
        lo, hi = min(samples), max(samples)
        out.append(dict(r, time_us=r["seconds"] * 1e6, algbw_gbps=algbw, busbw_gbps=busbw,
                        min_us=lo * 1e6, max_us=hi * 1e6, repeats=len(samples),
                        spread=(hi - lo) / r["seconds"] if r["seconds"] > 0 else None))
    return out


def run_bench(devices, sizes: list[int], iters: int, warmup: int, impls: list[str],
              backend: str, timeout: float, repeats: int = 5) -> dict[str, Any]:
    """Measure in a spawned process; returns {"scratch": rows, "torch": rows, "machine"} or
    {"error"}."""
    from gputui.hw.contention import LoadWatch, gpu_uuids

    kind = devices[0].kind
    backend = backend_for(backend, kind)
    spec = {"kind": kind, "indices": [d.index for d in devices], "sizes": sizes,
            "iters": iters, "warmup": warmup, "impls": impls, "backend": backend,
            "repeats": max(1, repeats)}
    watch = LoadWatch(gpu_uuids(devices))
    result = spawn_driver(spec, timeout)
    result["machine"] = watch.state()
    n = len(devices)
    for impl in ("scratch", "torch"):
        if impl in result:
            result[impl] = with_bandwidths(result[impl], n)
    result.update(devices=[d.name for d in devices], n=n, backend=backend)
    return result


def _child(spec: dict[str, Any], queue) -> None:
    """Spawned entry point; torch is imported here, never in the CLI process."""
    import os

    from gputui.hw.cuda_order import cuda_env

    # GPUs numbered as discovery numbers them (PCI order), before torch loads CUDA; the
    # ranks inherit this environment.
    os.environ.update(cuda_env())
    from gputui.train import comm_bench_ranks

    comm_bench_ranks.driver(spec, queue)


def spawn_driver(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run the measuring process and return its result; it and its ranks never outlive this
    call (killed on timeout, Ctrl-C or error)."""
    from gputui.core import ompwait
    from gputui.core.proctree import own_tracker

    own_tracker()  # before the queue: starting the tracker would unblock the signals
    ompwait.for_children()  # as a run's ranks wait (before the child loads torch)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(spec, q), name="gputui-bench-comm")
    with signals.deferred():  # held from its birth: never a traceback in its imports
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            signals.raise_if_stopped()  # a stop signal: killed below, nothing kept
            try:
                got = q.get(timeout=0.5)
            except queue_mod.Empty:
                pass
            else:  # a result that a signal cut short is no result
                signals.raise_if_stopped()
                return got
            if not proc.is_alive():
                try:
                    return q.get(timeout=1.0)
                except queue_mod.Empty:
                    return {"error": f"the benchmark process exited with code {proc.exitcode}"}
            if time.monotonic() > deadline:
                return {"error": f"no result within {timeout:g} s (raise --timeout)"}
    except BaseException:  # a stop signal, Ctrl-C: no waiting for the ranks to finish
        kill_tree(proc.pid)
        raise
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            kill_tree(proc.pid)
            proc.join(timeout=5)
