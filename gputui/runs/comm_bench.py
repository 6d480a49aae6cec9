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
(:mod:`gputui.train.comm_ranks`, started by :func:`measure`, which the prediction's timed
collectives use too); this module never imports torch.
"""

from __future__ import annotations

import os
from typing import Any

from gputui.core.devices import backend_for
from gputui.core.proctree import ask_children
from gputui.hw.contention import LoadWatch, gpu_uuids
from gputui.hw.cuda_order import cuda_env


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
    kind = devices[0].kind
    backend = backend_for(backend, kind)
    spec = {"what": "bench", "kind": kind, "indices": [d.index for d in devices], "sizes": sizes,
            "iters": iters, "warmup": warmup, "impls": impls, "backend": backend,
            "repeats": max(1, repeats)}
    watch = LoadWatch(gpu_uuids(devices))
    result = measure(spec, timeout, "gputui-bench-comm", " (raise --timeout)")
    result["machine"] = watch.state()
    n = len(devices)
    for impl in ("scratch", "torch"):
        if impl in result:
            result[impl] = with_bandwidths(result[impl], n)
    result.update(devices=[d.name for d in devices], n=n, backend=backend)
    return result


def comm_main(job: dict[str, Any], queue) -> None:
    """Spawned entry point of the measuring process; torch is imported here, never in the
    CLI process."""
    # GPUs numbered as discovery numbers them (PCI order), before torch loads CUDA; the
    # ranks inherit this environment.
    os.environ.update(cuda_env())
    from gputui.train import comm_ranks

    comm_ranks.driver(job, queue)


def measure(job: dict[str, Any], timeout: float, name: str, hint: str = "") -> dict[str, Any]:
    """Run one measuring process (``job["what"]``: "bench" or "in_step", see
    :mod:`gputui.train.comm_ranks`) and return its result, or {"error"}; it and its ranks
    never outlive this call (killed on timeout, a stop signal, Ctrl-C or error)."""
    answer = ask_children([(comm_main, (job,))], name, timeout)
    if answer.complete:
        return answer.messages[0]
    if answer.timed_out:
        return {"error": f"no result within {timeout:g} s{hint}"}
    return {"error": f"the measuring process exited with code {answer.exitcodes[0]}"}
