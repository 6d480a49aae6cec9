"""What the step meter (gputui/train/strategies/meter.py) costs a step, on the CPU.

    .venv/bin/python benchmarks/bench_meter.py [--rounds 20] [--steps 10000]

A strategy's step is written once and calls the meter on every step: ``begin``, two spans
(compute, optimizer) and ``finish``. On a step the loop does not meter, the spans mark
nothing; on a metered one (one per ``run.log_every``) each span takes two perf_counter marks.
Prints the best round's microseconds per step for both, beside a bare function call with one
test (what the step's ``if data_s is None`` branch cost before the meter), so a loaded machine
shows as a slow bare call too.
"""

from __future__ import annotations

import argparse
import time

import torch

from gputui.train.strategies.meter import Meter


def per_step(fn, data_s, rounds: int, steps: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(steps):
            fn(data_s)
        best = min(best, (time.perf_counter() - t) / steps)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10000)
    args = parser.parse_args()
    meter = Meter([torch.device("cpu")])

    def step(data_s):
        m = meter.begin(data_s)
        with m.compute:
            pass
        with m.optimizer:
            pass
        m.finish(samples=256)

    def bare(data_s):
        if data_s is None:
            return

    for label, fn, data_s in (("meter, unmetered step", step, None),
                              ("meter, metered step", step, 0.0),
                              ("bare call and test", bare, None)):
        print(f"{label:24} {per_step(fn, data_s, args.rounds, args.steps):7.3f} us/step")


if __name__ == "__main__":
    main()
