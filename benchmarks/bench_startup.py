#!/usr/bin/env python3
"""What a multi-process run costs to start, with the ranks' fork server forked from the run
host (gputui's default on CPU devices) against multiprocessing's own spawned server.

    .venv/bin/python benchmarks/bench_startup.py [--runs 3] [--strategy ddp] [--devices cpu*2]

Each try is a cold ``gputui run quickstart`` of one short epoch (512 images) on the devices,
once with each server (``GPUTUI_FORKSERVER=spawn`` is the baseline), alternated in one
sitting. For each it prints the CPU-seconds of the whole process tree (every process the
command started, reaped level by level, read from this process's RUSAGE_CHILDREN), the
wall-clock seconds, and the run's own start-up figure (``init``: launch to first step), as
medians with their spread, and the ratio of the medians. Run it on an idle machine; the load
is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(server: str, strategy: str, devices: str, runs_dir: str) -> tuple[float, float, float]:
    """(CPU-seconds of the tree, wall seconds, the run's init seconds) of one cold run."""
    env = dict(os.environ, GPUTUI_FORKSERVER=server)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gputui", "run", "quickstart", "--strategy",
                           strategy, "--devices", devices, "--epochs", "1", "--set",
                           "data.train_size=512", "--set", "data.test_size=128", "--runs-dir",
                           runs_dir, "--json"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"bench_startup: the {server} run failed:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, wall, float(json.loads(proc.stdout)["init_s"])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="tries of each server (default 3)")
    ap.add_argument("--strategy", default="ddp", help="a multi-process strategy (default ddp)")
    ap.add_argument("--devices", default="cpu*2", help="CPU devices (default cpu*2)")
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float, float]]] = {"fork": [], "spawn": []}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as runs:
        one("fork", args.strategy, args.devices, runs)  # warm the page cache: not counted
        for _ in range(args.runs):
            for server in ("spawn", "fork"):
                got[server].append(one(server, args.strategy, args.devices, runs))
    load1 = os.getloadavg()[0]
    print(f"bench_startup: cold `gputui run quickstart --strategy {args.strategy} --devices "
          f"{args.devices}` (1 epoch of 512 images), {args.runs} tries each, alternated; "
          f"{os.cpu_count()} cores, load {load0:.2f} -> {load1:.2f}")
    print(f"{'fork server':<22} {'CPU-s (tree)':>20} {'wall s':>20} {'init s':>20}")
    for server, label in (("spawn", "spawned (baseline)"), ("fork", "forked from the host")):
        cpu, wall, init = zip(*got[server], strict=True)
        print(f"{label:<22} {spread(list(cpu)):>20} {spread(list(wall)):>20} "
              f"{spread(list(init)):>20}")
    ratio = [statistics.median(x[i] for x in got["fork"]) /
             statistics.median(x[i] for x in got["spawn"]) for i in range(3)]
    print(f"forked / spawned (medians): CPU x{ratio[0]:.2f}, wall x{ratio[1]:.2f}, "
          f"init x{ratio[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
