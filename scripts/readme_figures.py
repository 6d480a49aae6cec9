#!/usr/bin/env python3
"""Regenerate every figure of docs/development.md's Speed section, with the machine and spread.

Runs each benchmark (and the quickstart) ``--repeats`` times, one after another, and prints
that section's table in Markdown: each figure as the median with the range over the repeats,
under a line naming the machine (CPU model, cores, torch, the load average before starting).
Each benchmark measures its own baseline in the same invocation, so ratios hold across
machines better than absolute figures do.

    .venv/bin/python scripts/readme_figures.py [--repeats 3] [--only quickstart,single,...]
        [--lock /tmp/gputui-cpu.lock]

``--lock FILE`` holds ``flock FILE`` around each measurement (a machine shared with others:
each measurement runs alone, others may run between two of them). The whole set takes about
five minutes a repeat on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _grab(pattern: str, out: str) -> float:
    found = re.search(pattern, out)
    if not found:
        raise ValueError(f"no match for {pattern!r} in the benchmark's output")
    return float(found.group(1))


def _quickstart(out: str) -> dict:
    return {"test_acc": 100 * json.loads(out)["test_acc"]}


def _comm(out: str) -> dict:
    result = json.loads(out)
    figures = {}
    for impl in ("scratch", "torch"):
        for row in result.get(impl, []):
            figures[f"{impl}_{row['size']}_us"] = row["time_us"]
    return figures


def _sampler(out: str) -> dict:
    return {"cost_pct": _grab(r"cost of sampling alone: ([\d.]+) %", out),
            "idle_pct": _grab(r"baseline idle loop: .*= ([\d.]+) %", out)}


def _tui(out: str) -> dict:
    num = r"\s+([\d.]+) ms"
    return {"paint_ms": _grab(r"gputui \(set-up screen\)" + num, out),
            "bare_ms": _grab(r"bare Textual hello world" + num, out),
            "python_ms": _grab(r"python -c pass" + num, out),
            "type_idle_ms": _grab(r"typing a key\s+idle\s+([\d.]+) ms", out),
            "type_busy_ms": _grab(r"typing a key.*run active\s+([\d.]+) ms", out),
            "palette_idle_ms": _grab(r"Ctrl\+P \(a modal\)\s+idle\s+([\d.]+) ms", out),
            "palette_busy_ms": _grab(r"Ctrl\+P \(a modal\).*run active\s+([\d.]+) ms", out)}


# name -> (what, command as the docs give it, extra args for machine-readable output, parser)
BENCHMARKS = {
    "quickstart": ("`quickstart` preset, launch to exit (3 epochs of 12,000 images)",
                   ".venv/bin/gputui run quickstart", ["--json"], _quickstart),
    "single": ("gputui `single` vs a plain PyTorch loop (LeNet, batch 256, 2 threads)",
               ".venv/bin/python benchmarks/bench_single.py", ["--json"], _last_json),
    "ddp": ("`ddp`, 2 CPU ranks x 1 thread, vs `single` with 2 threads (LeNet, batch 256)",
            ".venv/bin/python benchmarks/bench_ddp.py", ["--json"], _last_json),
    "sampler": ("telemetry sampler at 4 Hz, share of one core",
                ".venv/bin/python benchmarks/bench_sampler.py", [], _sampler),
    "tui": ("the app: first paint, keystroke to screen", ".venv/bin/python benchmarks/bench_tui.py",
            [], _tui),
    "comm": ("allreduce, scratch (in-process copies) vs gloo (2 processes)",
             ".venv/bin/gputui bench-comm --devices 'cpu*2' --sizes 4K,64K,1M,4M",
             ["--json"], _comm),
}


def machine() -> str:
    """One line: CPU model, cores, OS, Python, torch, and the load before measuring."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    torch = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip() or "?"
    return (f"{model}, {os.cpu_count()} cores, no GPU used; {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, torch {torch}; "
            f"1-min load {os.getloadavg()[0]:.2f} before starting")


def run_once(name: str, lock: str | None) -> tuple[dict, float]:
    """One invocation of a benchmark: its figures and its wall time."""
    _, readme_cmd, extra, parse = BENCHMARKS[name]
    argv = shlex.split(readme_cmd) + extra
    if argv[0] == ".venv/bin/gputui":
        argv = [PY, "-m", "gputui", *argv[1:]]
    elif argv[0] == ".venv/bin/python":
        argv = [PY, *argv[1:]]
    with contextlib.ExitStack() as stack:
        if lock:  # held around the measurement only: the wait for it is not timed
            fh = stack.enter_context(open(lock, "a"))
            fcntl.flock(fh, fcntl.LOCK_EX)
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ, GPUTUI_RUNS_DIR=str(ROOT / "runs" / "figures")))
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{readme_cmd} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return parse(proc.stdout), wall


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """'median (min-max, n=3)'."""
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))}, n={len(values)})"


def rows(name: str, runs: list[dict], walls: list[float]) -> list[str]:
    """The Speed table's cells for one benchmark."""
    col = {k: [r[k] for r in runs] for k in runs[0]}
    f1, f2, f3 = "{:,.1f}", "{:.2f}", "{:.3f}"
    if name == "quickstart":
        return [f"{spread(walls, f1)} s to exit, test accuracy {spread(col['test_acc'], f1)} %"]
    if name == "single":
        return [f"{spread(col['gputui'])} vs {spread(col['plain'])} samples/s: "
                f"**{spread(col['ratio'], f3)}×** (target ≥ 0.99)"]
    if name == "ddp":
        ratio = [r["ddp"] / r["single"] for r in runs]
        plain = [r["plain_ddp"] / r["single"] for r in runs]
        ceiling = [r["ceiling"] / r["single"] for r in runs]
        return [f"{spread(col['ddp'])} vs {spread(col['single'])} samples/s: "
                f"**{spread(ratio, f2)}×**; hand-written DDP loop {spread(plain, f2)}×; two "
                f"ranks without communication (the ceiling) {spread(ceiling, f2)}×; launch to "
                f"first step **{spread(col['ddp_start'], f2)} s** (bare 2-rank elastic launch "
                f"{spread(col['bare_start'], f2)} s)"]
    if name == "sampler":
        return [f"**{spread(col['cost_pct'], f3)} %** (target < 1 %; idle-thread baseline "
                f"{spread(col['idle_pct'], f3)} %)"]
    if name == "tui":
        return [f"first paint **{spread(col['paint_ms'])} ms** (bare Textual app "
                f"{spread(col['bare_ms'])} ms, `python -c pass` {spread(col['python_ms'])} ms); "
                f"a key typed while a run keeps both cores busy {spread(col['type_busy_ms'])} "
                f"ms (idle {spread(col['type_idle_ms'])} ms), Ctrl+P "
                f"{spread(col['palette_busy_ms'])} ms (idle {spread(col['palette_idle_ms'])} "
                f"ms)"]
    cells = []
    for size, label in ((4096, "4 KiB"), (1048576, "1 MiB")):
        s, t = col.get(f"scratch_{size}_us"), col.get(f"torch_{size}_us")
        if s and t:
            cells.append(f"{label}: scratch {spread(s, f1)} µs, gloo {spread(t, f1)} µs")
    return ["; ".join(cells)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="invocations of each benchmark")
    ap.add_argument("--only", default=",".join(BENCHMARKS),
                    help=f"comma list of: {', '.join(BENCHMARKS)}")
    ap.add_argument("--lock", help="run each measurement under `flock LOCK`")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    header = machine()
    table = ["| benchmark | command | result: median (range over runs) |", "|---|---|---|"]
    for name in names:
        runs, walls = [], []
        for i in range(args.repeats):
            figures, wall = run_once(name, args.lock)
            runs.append(figures)
            walls.append(wall)
            print(f"{name} {i + 1}/{args.repeats}: {wall:.1f} s {figures}", file=sys.stderr,
                  flush=True)
        what, command, _, _ = BENCHMARKS[name]
        table.append(f"| {what} | `{command}` | {rows(name, runs, walls)[0]} |")
    runs = "1 run" if args.repeats == 1 else f"{args.repeats} runs"
    print(f"Measured on: {header}; {runs} of each, "
          f"{time.strftime('%Y-%m-%d')}, by `.venv/bin/python scripts/readme_figures.py`.\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
