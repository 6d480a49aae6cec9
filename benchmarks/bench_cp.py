"""What context parallelism costs and buys, against `single` in the same invocation: tokens/s
and the peak activation memory per rank of `single` and `cp` at each of two context lengths.

    .venv/bin/python benchmarks/bench_cp.py [PRESET] [--devices cpu*2] [--contexts 128,256]
        [--epochs 2] [--set key=value ...] [--json]

Each run goes through the launcher as a user's run does (one rank per device). From the step
events after the first epoch (warm-up): tokens/s (samples/s x data.context) and their ratio to
`single` at the same context; from the run's first memory report: the largest rank's
activations (what autograd saved for backward, the ring's blocks included), parameters,
gradients and optimizer state; from the metered steps: the seconds the ring's sends and
receives were in flight per step (the collective "cp ring send/recv") and the part of it a
rank waited for after its attention compute ("cp ring wait": the rest hid behind that
compute), and the step breakdown's shares of exposed and hidden communication (DDP's or
fully_shard's and the ring's together).
The machine's load average is printed before and after: on a shared machine the ratios move
with it (docs/measuring.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runloop import largest, mib, steady_run  # noqa: E402

KIND, WAIT = "cp ring send/recv", "cp ring wait"


def run(cfg) -> dict:
    """One run through the launcher: steady tokens/s, the first memory report's largest rank,
    the ring's seconds per step and the step's exposed and hidden communication."""
    steps, rows = steady_run(cfg, "gputui-bench-cp-")
    out: dict = {"tokens_per_s": statistics.mean(e.tokens_per_s for e in steps)}
    for key in ("params", "grads", "optim", "activations"):
        out[key] = largest(rows, key)
    ring = [r.collectives[KIND] for e in steps for r in (e.per_device or ())
            if r.collectives and KIND in r.collectives]
    out["ring_s"] = statistics.mean(ring) if ring else None
    waits = [r.collectives.get(WAIT, 0.0) for e in steps for r in (e.per_device or ())
             if r.collectives and KIND in r.collectives]
    out["ring_wait_s"] = statistics.mean(waits) if waits else None
    parts = [e.breakdown for e in steps if e.breakdown is not None]
    out["exposed"] = statistics.mean(p.comm_exposed_s / p.step_s for p in parts
                                     if p.comm_exposed_s is not None and p.step_s) \
        if parts else None
    out["hidden"] = statistics.mean(p.comm_overlap_s / p.step_s for p in parts
                                    if p.comm_overlap_s is not None and p.step_s) \
        if parts else None
    out["step_s"] = statistics.mean(e.step_time_s for e in steps)
    return out


def main() -> None:
    from gputui.cli.common import set_overrides
    from gputui.core.config import ConfigError
    from gputui.core.presets import resolve_preset
    from gputui.hw.discovery import resolve_devices
    from gputui.plan import validate
    from gputui.runs.prepare import load_base

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="gpt-tiny")
    ap.add_argument("--devices", default="cpu*2")
    ap.add_argument("--contexts", default="128,256")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = load_base(str(resolve_preset(args.preset)), set_overrides(args.sets, args.epochs))
    base = base.replace(run={"checkpoint": False, "log_every": 4},
                        telemetry={"enabled": False})
    contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{os.cpu_count()} cores", flush=True)
    res: dict[str, dict] = {}
    for context in contexts:
        for strategy, spec in (("single", "cpu"), ("cp", args.devices)):
            name = f"{strategy}@{context}"
            cfg = base.replace(devices={"spec": spec}, strategy={"name": strategy},
                               data={"context": context})
            try:
                validate(cfg, resolve_devices(spec), name)
                res[name] = run(cfg)
            except (ConfigError, SystemExit) as exc:
                print(f"{name:12s} skipped: {exc}", flush=True)
                continue
            print(f"{name:12s} {res[name]['tokens_per_s']:10,.0f} tokens/s", flush=True)
    load1 = os.getloadavg()
    print(f"\n{'run':12s} {'tokens/s':>10s} {'x single':>8s} {'activ.':>7s} {'params':>7s} "
          f"{'grads':>7s} {'optim':>7s}  MiB per rank (largest)  ring s/step  waited  "
          f"exposed  hidden")
    for name, got in res.items():
        one = res.get(f"single@{name.split('@')[1]}")
        ratio = f"{got['tokens_per_s'] / one['tokens_per_s']:8.2f}" if one else "       -"
        ring = (f"{got['ring_s']:11.4f}  {got['ring_wait_s']:6.4f}"
                if got["ring_s"] is not None else "          -       -")
        share = "  ".join(f"{got[k]:6.0%}" if got[k] is not None else "     -"
                          for k in ("exposed", "hidden"))
        print(f"{name:12s} {got['tokens_per_s']:10,.0f} {ratio} {mib(got['activations'])} "
              f"{mib(got['params'])} {mib(got['grads'])} {mib(got['optim'])}  "
              f"{'':22s}{ring}  {share}")
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        print(json.dumps({"devices": args.devices, "load_before": load0, "load_after": load1,
                          "results": res}, indent=2))


if __name__ == "__main__":
    main()
