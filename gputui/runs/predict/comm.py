"""The allreduce as DDP issues it, timed for the prediction (torch is imported in spawned
processes only: the ranks are :mod:`gputui.train.comm_ranks`'s, started as bench-comm's are).

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
flat (padded) parameter bytes. ``comm_ranks.fsdp_calls`` lists them in a step's order from the
units' sizes (counted from the model itself, the way the fsdp strategy wraps it:
``comm_ranks.fsdp_units``), and :func:`fsdp_in_step` times that sequence between ranks with the
step's compute cut into equal slices between the calls: on the CPU gloo runs each call on the
training thread, so each pays its latency and waits for the slower rank, as in training.
"""

from __future__ import annotations

import subprocess
import sys

from gputui.runs.comm_bench import measure

FIRST_BUCKET = 2**20  # DDP's first bucket: a gradient this small is one call after backward
_SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


def allreduce_in_step(n: int, size: int, gap: float, kind: str, cores: int,
                      timeout: float = 600.0) -> float:
    """Seconds of one all_reduce of ``size`` bytes over ``n`` ranks between ``gap`` seconds of
    compute (cores kept busy for sizes above DDP's first bucket, on the CPU); raises
    RuntimeError (one line) on failure. No process outlives the call."""
    return _measure(n, size, gap, kind, cores, timeout)["seconds"]


def fsdp_in_step(cfg_dict: dict, n: int, gap: float, kind: str, cores: int,
                 timeout: float = 600.0) -> dict:
    """Seconds that one step's fsdp collectives (``comm_ranks.fsdp_calls`` of the configured
    model's units) add to a step of ``gap`` seconds of compute over ``n`` ranks, with their count
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
    job = {"what": "in_step", "n": n, "size": size, "gap": gap, "iters": iters,
           "threads": threads, "kind": kind, "cfg": cfg_dict}
    try:
        result = measure(job, timeout, "gputui-predict-comm")
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    if "error" in result:
        what = "fsdp collectives" if cfg_dict is not None else "allreduce"
        raise RuntimeError(f"{what} measurement failed: {result['error']}")
    return result
