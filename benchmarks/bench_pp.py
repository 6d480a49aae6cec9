"""gputui's `pp` (2 CPU ranks, one stage each) against `single` on the same preset, in the same
run of this script: tokens/s (or samples/s), each stage's bubble and step breakdown.

    .venv/bin/python benchmarks/bench_pp.py [--preset gpt-tiny] [--rounds 2] [--epochs 2]
        [--chunks 4] [--schedules gpipe,1f1b] [--set KEY=VALUE ...]

Every run is a real `gputui run` (launcher, run host, ranks), with the preset's config and only
the strategy, devices and epochs changed: `single` on `cpu` with every core and with one
thread (what each pp rank gets on two cores), `pp` on `cpu*2` (each rank its share of the
cores). Rounds alternate (single, single 1t, pp gpipe, pp 1f1b, single, ...). Throughput is
the steady state of the record's epochs after the first (warm-up): training time only,
evaluation excluded. The bubble and the breakdown are the means of the
metered steps but the first, per stage (``per_device`` rows of the record's ``step`` events).
Prints one line per run and the medians, with pp / single.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gputui.core import breakdown


def run(preset: str, runs_dir: Path, strategy: str, spec: str, epochs: int,
        sets: list[str]) -> Path:
    """One `gputui run`; returns its record folder."""
    args = [sys.executable, "-m", "gputui", "--runs-dir", str(runs_dir), "run", preset,
            "--set", f"strategy.name={strategy}", "--set", f"devices.spec={spec}",
            "--set", f"run.epochs={epochs}", "--set", "run.checkpoint=false",
            "--set", "telemetry.enabled=false"]
    for item in sets:
        args += ["--set", item]
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} on {spec} failed:\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    (new,) = [p for p in runs_dir.iterdir() if p not in before and p.is_dir()]
    return new


def figures(record: Path) -> dict:
    """Steady throughput (epochs after the first), and per stage the mean breakdown and
    bubble of the metered steps but the first."""
    events = [json.loads(line) for line in (record / "events.jsonl").read_text().splitlines()]
    ends = [e for e in events if e["type"] == "epoch_end"]
    ends = ends[1:] or ends  # one epoch only: warm-up included
    secs = sum(e["seconds"] for e in ends)
    out = {"samples_per_s": sum(e["samples_per_s"] * e["seconds"] for e in ends) / secs}
    tokens = [e.get("tokens_per_s") for e in ends]
    if all(t is not None for t in tokens) and tokens:
        pairs = zip(tokens, ends, strict=True)
        out["tokens_per_s"] = sum(t * e["seconds"] for t, e in pairs) / secs
    steps = [e for e in events if e["type"] == "step"]
    steps = steps[1:] or steps
    stages: dict[str, list] = {}
    for ev in steps:
        for row in ev["per_device"]:
            stages.setdefault(row["device"], []).append(row)
    out["stages"] = {
        dev: {"breakdown": breakdown.mean(r.get("breakdown") for r in rows),
              "bubble_share": breakdown.mean_of(rows, "bubble_share"),
              "bubble_theory": breakdown.mean_of(rows, "bubble_theory"),
              "send_s": breakdown.mean_of(rows, "send_s"),
              "recv_s": breakdown.mean_of(rows, "recv_s")}
        for dev, rows in stages.items()}
    out["breakdown"] = breakdown.mean(ev.get("breakdown") for ev in steps)
    return out


def rate(f: dict) -> float:
    return f.get("tokens_per_s") or f["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-tiny")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--runs-dir", default="", help="keep the records here (default: a "
                                                  "temporary folder, removed)")
    args = ap.parse_args()
    # single with every core (the baseline), and with one thread (what each pp rank has)
    kinds = [("single", "single", "cpu", []), ("single 1t", "single", "cpu", ["run.threads=1"])]
    kinds += [(f"pp {s}", "pp", "cpu*2", [f"strategy.schedule={s}",
                                          f"strategy.pipeline_chunks={args.chunks}"])
              for s in args.schedules.split(",")]
    results: dict[str, list[dict]] = {k[0]: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(args.runs_dir or tmp)
        runs_dir.mkdir(parents=True, exist_ok=True)
        for r in range(args.rounds):
            for label, strategy, spec, extra in kinds:
                f = figures(run(args.preset, runs_dir, strategy, spec, args.epochs,
                                args.sets + extra))
                results[label].append(f)
                unit = "tokens/s" if "tokens_per_s" in f else "samples/s"
                print(f"round {r + 1} {label:<9} {rate(f):>10,.0f} {unit}  "
                      f"{breakdown.line(f['breakdown'])}")
                for dev, s in f["stages"].items():
                    if s["bubble_share"] is not None:
                        print(f"    {dev} {breakdown.line(s['breakdown'])}; bubble "
                              f"{s['bubble_share']:.0%} (theory {s['bubble_theory']:.0%}), "
                              f"sends {1000 * s['send_s']:.1f} ms, receives "
                              f"{1000 * s['recv_s']:.1f} ms")
    base = statistics.median(rate(f) for f in results["single"])
    print(f"\nmedians over {args.rounds} round(s), preset {args.preset}:")
    for label, runs in results.items():
        med = statistics.median(rate(f) for f in runs)
        spread = f"{min(rate(f) for f in runs):,.0f}-{max(rate(f) for f in runs):,.0f}"
        print(f"  {label:<9} {med:>10,.0f} ({spread}, n={len(runs)})  x{med / base:.2f} "
              f"of single")


if __name__ == "__main__":
    main()
