#!/usr/bin/env python3
"""What torch's spinning intra-op threads cost when something else shares the cores.

    .venv/bin/python benchmarks/bench_omp_wait.py [--steps 12] [--batch 16] [--tries 2]

Trains gputui's ResNet-18 (the material's variant, 28x28 inputs) for ``--steps`` steps of
``--batch`` images in a fresh process with torch's default threads, and prints the mean step
time of four set-ups, each run ``--tries`` times, in one sitting:

1. one process alone, OpenMP's default waiting (threads spin at each barrier);
2. one process alone, ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep);
3. two such processes at once, default;
4. two such processes at once, passive.

1 and 2 are the quiet machine's cost of passive waiting; 3 and 4 what a second busy process
makes of each. This is why the test suite sets ``OMP_WAIT_POLICY=PASSIVE`` (tests/conftest.py):
its workers share the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP_LOOP = """
import sys, time, torch
sys.path.insert(0, {root!r})
from gputui.train.models import resnet18
torch.manual_seed(0)
m = resnet18()
x, y = torch.randn({batch}, 1, 28, 28), torch.randint(0, 10, ({batch},))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
def step():
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()
    opt.zero_grad()
for _ in range(2):
    step()
t = time.perf_counter()
for _ in range({steps}):
    step()
print((time.perf_counter() - t) / {steps})
"""


def run(n: int, passive: bool, steps: int, batch: int) -> list[float]:
    """Start ``n`` step loops at once; their mean step times in seconds."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    code = STEP_LOOP.format(root=str(ROOT), steps=steps, batch=batch)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(n)]
    return [float(p.communicate()[0].strip()) for p in procs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tries", type=int, default=2)
    args = ap.parse_args()
    cases = [("alone, default (spinning)", 1, False), ("alone, passive", 1, True),
             ("two at once, default", 2, False), ("two at once, passive", 2, True)]
    print(f"ResNet-18 steps of {args.batch} images, {os.cpu_count()} cores, "
          f"{args.tries} tries each (every process's mean step)")
    for label, n, passive in cases:
        times = [t for _ in range(args.tries) for t in run(n, passive, args.steps, args.batch)]
        print(f"  {label:28s} median {statistics.median(times) * 1000:7.0f} ms "
              f"({min(times) * 1000:.0f}-{max(times) * 1000:.0f} ms, n={len(times)})")


if __name__ == "__main__":
    main()
