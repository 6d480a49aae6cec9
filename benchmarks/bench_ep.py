"""What expert parallelism costs and buys on a mixture-of-experts GPT, against `single` in the
same invocation, at two expert counts: tokens/s, the expert parameters each rank holds, the
activations autograd saved per rank, the all-to-alls' time and bytes per metered step, and the
share of assignments the capacity dropped.

    .venv/bin/python benchmarks/bench_ep.py [PRESET] [--devices cpu*2] [--experts 4,8]
        [--epochs 2] [--set key=value ...] [--json]

For each expert count E: `single` (every expert on one device), `ddp` with ep 1 (every rank
holds every expert, gradients all-reduced), `ddp` with ep = the ranks (each rank holds E /
ranks experts; tokens dispatched and combined by all-to-all) and `fsdp` with the same ep (the
dense layers sharded too). Each runs as a user's run does (the launcher, one rank per
device); the figures are the steps after the first epoch (warm-up) and the first memory
report's largest rank. The machine's load average is printed before and after: on a shared
machine the ratios move with it (docs/measuring.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runloop import largest, mib, steady_run  # noqa: E402


def variants(ranks: int) -> dict[str, tuple[str, dict]]:
    """name -> (strategy, [parallel] overrides) for one expert count."""
    return {"single": ("single", {}), "ddp ep1": ("ddp", {"ep": 1}),
            f"ddp ep{ranks}": ("ddp", {"ep": ranks}), f"fsdp ep{ranks}": ("fsdp", {"ep": ranks})}


def run(cfg) -> dict:
    """One run through the launcher: steady tokens/s, the largest rank's memory, the named
    collectives of the metered steps, the dropped share."""
    steps, rows = steady_run(cfg, "gputui-bench-ep-")
    out: dict = {"samples_per_s": statistics.mean(e.samples_per_s for e in steps)}
    for key in ("params", "experts", "activations"):
        out[key] = largest(rows, key)
    routed = sum(sum(e.moe["routed"]) for e in steps if e.moe)
    dropped = sum(e.moe["dropped"] for e in steps if e.moe)
    out["dropped"] = dropped / routed if routed else None
    a2a_s, a2a_bytes, timed = 0.0, 0, 0
    for e in steps:
        for r in e.per_device or ():
            if r.rank == 0 and r.collectives:
                timed += 1
                a2a_s += sum(v for k, v in r.collectives.items() if k.startswith("ep "))
                a2a_bytes += sum(v for k, v in (r.collective_bytes or {}).items()
                                 if k in ("ep dispatch", "ep combine"))
    out["a2a_ms"] = 1000 * a2a_s / timed if timed else None
    out["a2a_kib"] = a2a_bytes / 1024 / timed if timed else None
    return out


def main() -> None:
    from gputui.cli.common import set_overrides
    from gputui.core.config import ConfigError
    from gputui.core.presets import resolve_preset
    from gputui.hw.discovery import resolve_devices
    from gputui.plan import validate
    from gputui.runs.prepare import load_base

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="gpt-moe-tiny")
    ap.add_argument("--devices", default="cpu*2")
    ap.add_argument("--experts", default="4,8", help="comma-separated expert counts")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = load_base(str(resolve_preset(args.preset)), set_overrides(args.sets, args.epochs))
    base = base.replace(run={"checkpoint": False, "log_every": 4}, telemetry={"enabled": False})
    context = base.data.context
    ranks = len(resolve_devices(args.devices))
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{os.cpu_count()} cores", flush=True)
    res: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    for experts in [int(e) for e in args.experts.split(",") if e.strip()]:
        for name, (strategy, parallel) in variants(ranks).items():
            key = f"E{experts} {name}"
            spec = "cpu" if strategy == "single" else args.devices
            cfg = base.replace(devices={"spec": spec}, strategy={"name": strategy},
                               model={"moe_experts": experts}, parallel=parallel)
            try:
                validate(cfg, resolve_devices(spec), key)
                res[key] = run(cfg)
            except (ConfigError, SystemExit) as exc:
                skipped[key] = str(exc)
                print(f"{key:16s} skipped: {exc}", flush=True)
                continue
            res[key]["x_single"] = (res[key]["samples_per_s"]
                                    / res[f"E{experts} single"]["samples_per_s"])
            print(f"{key:16s} {res[key]['samples_per_s'] * context:10,.0f} tokens/s", flush=True)
    load1 = os.getloadavg()
    print(f"\n{'variant':16s} {'tokens/s':>10s} {'x single':>8s} {'params':>7s} {'experts':>7s} "
          f"{'activ.':>7s}  MiB per rank (largest)  {'a2a ms':>7s} {'a2a KiB':>8s} "
          f"per metered step (rank 0)  dropped")
    for key, got in res.items():
        a2a = (f"{got['a2a_ms']:7.1f} {got['a2a_kib']:8.0f}" if got["a2a_ms"] is not None
               and got["a2a_kib"] else f"{'-':>7s} {'-':>8s}")
        dropped = f"{got['dropped']:.1%}" if got["dropped"] is not None else "n/a"
        print(f"{key:16s} {got['samples_per_s'] * context:10,.0f} {got['x_single']:8.2f} "
              f"{mib(got['params'])} {mib(got['experts'])} {mib(got['activations'])}  "
              f"{'':22s}  {a2a} {'':25s} {dropped}")
    for key, why in skipped.items():
        print(f"{key:16s} skipped: {why}")
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        print(json.dumps({"devices": args.devices, "load_before": load0, "load_after": load1,
                          "results": res, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    main()
