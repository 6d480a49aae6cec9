"""gputui's `tp` (and other strategies) against `single` on a preset, in the same invocation.

    .venv/bin/python benchmarks/bench_tp.py PRESET [--strategies tp] [--devices cpu*2]
        [--rounds 2] [--set key=value ...] [--json]

Each round runs `single` on one device (every core's threads) and then each strategy on
``--devices``, all launched as users launch them (launcher -> worker, or elastic agent -> one
rank per device), rounds alternating. From every step event after the first epoch (warm-up):
samples/s (tokens/s = samples/s x data.context for a language model) and the mean of the
metered steps' breakdowns (the ranks' mean: compute, exposed comm, optimizer, data, host).
Medians over the rounds, and each strategy's ratio to `single`, are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runloop import steady_run  # noqa: E402

PARTS = ("step_s", "compute_s", "comm_exposed_s", "optimizer_s", "data_s", "host_s")


def run(cfg) -> dict:
    """One run through the launcher: steady samples/s and the mean breakdown."""
    steps, _ = steady_run(cfg, "gputui-bench-tp-")
    out = {"samples_per_s": statistics.mean(e.samples_per_s for e in steps)}
    rows = [r.breakdown.to_dict() for e in steps for r in (e.per_device or ()) if r.breakdown]
    rows = rows or [e.breakdown.to_dict() for e in steps if e.breakdown]
    for part in PARTS:
        values = [r[part] for r in rows if r.get(part) is not None]
        out[part] = statistics.mean(values) if values else None
    return out


def main() -> None:
    from gputui.cli.common import set_overrides
    from gputui.runs.prepare import load_base
    from gputui.core.presets import resolve_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--strategies", default="tp")
    ap.add_argument("--devices", default="cpu*2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = load_base(str(resolve_preset(args.preset)),
                               set_overrides(args.sets, args.epochs))
    base = base.replace(run={"checkpoint": False, "log_every": 5},
                        telemetry={"enabled": False})
    context = getattr(base.data, "context", 0) if base.model.name == "gpt" else 0
    names = ["single"] + [s.strip() for s in args.strategies.split(",") if s.strip()]
    res: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            spec = "cpu" if name == "single" and args.devices.startswith("cpu") else (
                "0" if name == "single" else args.devices)
            cfg = base.replace(strategy={"name": name}, devices={"spec": spec})
            res[name].append(run(cfg))
            got = res[name][-1]
            tok = f", {got['samples_per_s'] * context:,.0f} tokens/s" if context else ""
            print(f"round {r + 1} {name:8s} {got['samples_per_s']:9,.1f} samples/s{tok}",
                  flush=True)
    med = {n: {k: statistics.median(v[k] for v in runs if v[k] is not None)
               if any(v[k] is not None for v in runs) else None for k in runs[0]}
           for n, runs in res.items()}
    for n, m in med.items():
        ratio = m["samples_per_s"] / med["single"]["samples_per_s"]
        parts = "  ".join(f"{k[:-2]} {m[k] * 1000:.1f} ms" for k in PARTS if m[k] is not None)
        tok = f" ({m['samples_per_s'] * context:,.0f} tokens/s)" if context else ""
        print(f"median {n:8s} {m['samples_per_s']:9,.1f} samples/s{tok}, x{ratio:.3f} of "
              f"single; step breakdown: {parts}")
    if args.json:
        print(json.dumps(med))


if __name__ == "__main__":
    main()
