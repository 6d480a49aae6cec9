"""What each memory lever and pipeline schedule costs and buys on one preset, against `single`
in the same invocation: every ZeRO stage, every activation-checkpointing mode, every pipeline
schedule this torch has and a few 2-D meshes, on ``--devices`` (default cpu*4).

    .venv/bin/python benchmarks/bench_mesh.py [PRESET] [--devices cpu*4] [--only NAME,...]
        [--epochs 2] [--set key=value ...] [--json]

e.g. (gpt-tiny with 6 blocks, so that 4 ranks x 2 stages fit the looped schedules):
    .venv/bin/python benchmarks/bench_mesh.py gpt-tiny --devices cpu*4 \
        --set model.n_layer=6 --set data.train_size=512

Each variant runs as a user's run does (the launcher, one rank per device). From the step
events after the first epoch (warm-up): tokens/s (samples/s x data.context), and their ratio to
`single` (one device, every core); from the run's first memory report: the largest rank's
parameters, gradients, optimizer state and the activations autograd saved for backward (None
where not measured: selective checkpointing keeps its outputs out of the meter's sight), and
their sum, the training state's peak per rank; for pp, the ranks' mean measured bubble share
beside the schedule's theory. The machine's load average is printed before and after: on a
shared machine the ratios move with it (docs/measuring.md).
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

# name -> (strategy, config overrides)
VARIANTS: dict[str, tuple[str, dict]] = {
    "single": ("single", {}),
    "ddp": ("ddp", {}),
    "zero1": ("fsdp", {"parallel": {"zero": 1}}),
    "zero2": ("fsdp", {"parallel": {"zero": 2}}),
    "zero3": ("fsdp", {"parallel": {"zero": 3}}),
    "ddp+ac_full": ("ddp", {"parallel": {"ac": "full"}}),
    "ddp+ac_selective": ("ddp", {"parallel": {"ac": "selective"}}),
    "zero3+ac_full": ("fsdp", {"parallel": {"ac": "full"}}),
    "hsdp_2x2": ("mesh", {"parallel": {"dp_replicate": 2, "dp_shard": 2}}),
    "shard2_x_tp2": ("mesh", {"parallel": {"dp_shard": 2, "tp": 2}}),
    "pp2_x_shard2": ("mesh", {"parallel": {"pp": 2, "dp_shard": 2},
                              "strategy": {"schedule": "1f1b"}}),
    **{f"pp_{kind}": ("pp", {"strategy": {"schedule": kind}})
       for kind in ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zb")},
    # the V schedules hold 2 stages a rank and need a micro-batch per stage at least
    **{f"pp_{kind}": ("pp", {"strategy": {"schedule": kind, "pipeline_chunks": 8}})
       for kind in ("zbv", "dualpipev")},
}


def run(cfg) -> dict:
    """One run through the launcher: steady samples/s, the first memory report's largest
    rank, the pipeline's bubble."""
    steps, rows = steady_run(cfg, "gputui-bench-mesh-")
    out: dict = {"samples_per_s": statistics.mean(e.samples_per_s for e in steps)}
    for key in ("params", "grads", "optim", "activations"):
        out[key] = largest(rows, key)
    parts = [out[k] for k in ("params", "grads", "optim", "activations")]
    out["peak"] = sum(parts) if all(p is not None for p in parts) else None
    shares = [r.bubble_share for e in steps for r in (e.per_device or ())
              if r.bubble_share is not None]
    theory = [r.bubble_theory for e in steps for r in (e.per_device or ())
              if r.bubble_theory is not None]
    out["bubble"] = statistics.mean(shares) if shares else None
    out["bubble_theory"] = theory[0] if theory else None
    return out


def main() -> None:
    from gputui.cli.common import set_overrides
    from gputui.runs.prepare import load_base
    from gputui.core.presets import resolve_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="gpt-tiny")
    ap.add_argument("--devices", default="cpu*4")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = load_base(str(resolve_preset(args.preset)),
                               set_overrides(args.sets, args.epochs))
    base = base.replace(run={"checkpoint": False, "log_every": 4},
                        telemetry={"enabled": False})
    context = base.data.context if base.model.name == "gpt" else 1
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(VARIANTS)
    if "single" not in names:
        names.insert(0, "single")
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{os.cpu_count()} cores", flush=True)
    from gputui.core.config import ConfigError
    from gputui.hw.discovery import resolve_devices
    from gputui.plan import validate

    res: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    for name in names:
        strategy, extra = VARIANTS[name]
        spec = "cpu" if strategy == "single" else args.devices
        changes = {t: dict(v) for t, v in extra.items()}
        changes.setdefault("strategy", {})["name"] = strategy
        cfg = base.replace(devices={"spec": spec}, **changes)
        try:  # the plan's rules first, as `gputui run` checks them
            validate(cfg, resolve_devices(spec), name)
            res[name] = run(cfg)
        except (ConfigError, SystemExit) as exc:
            skipped[name] = str(exc)
            print(f"{name:18s} skipped: {exc}", flush=True)
            continue
        got = res[name]
        print(f"{name:18s} {got['samples_per_s'] * context:10,.0f} tokens/s", flush=True)
    load1 = os.getloadavg()
    one = res["single"]["samples_per_s"]
    print(f"\n{'variant':18s} {'tokens/s':>10s} {'x single':>8s} {'params':>7s} {'grads':>7s} "
          f"{'optim':>7s} {'activ.':>7s} {'peak':>7s}  MiB per rank (largest)  bubble/theory")
    for name, got in res.items():
        bubble = (f"{got['bubble']:.0%}" if got["bubble"] is not None else "") + (
            f" / {got['bubble_theory']:.0%}" if got["bubble_theory"] is not None else
            (" / none (zero bubble)" if got["bubble"] is not None else ""))
        print(f"{name:18s} {got['samples_per_s'] * context:10,.0f} "
              f"{got['samples_per_s'] / one:8.2f} {mib(got['params'])} {mib(got['grads'])} "
              f"{mib(got['optim'])} {mib(got['activations'])} {mib(got['peak'])}  {bubble}")
    for name, why in skipped.items():
        print(f"{name:18s} skipped: {why}")
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        print(json.dumps({"devices": args.devices, "load_before": load0, "load_after": load1,
                          "results": res, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    main()
