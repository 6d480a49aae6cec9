"""The fast path measured: eager fp32 against channels_last, bf16 and torch.compile modes.

    .venv/bin/python benchmarks/bench_fastpath.py [--device cpu|cuda] [--model lenet|resnet18]
        [--variants fp32,cl,bf16,bf16+cl,compile,...] [--epochs 3] [--threads 2]

Every variant is gputui's `single` strategy through the loop, set up as a run sets it up
(compiling before the first step: compile seconds are reported apart), on the same synthetic
data, seed and batch order, in this process. Each trains ``--epochs`` epochs; the first is
warm-up and not counted; samples/s is training time only. A variant is a '+' list of: fp32,
bf16, fp16 (CUDA), cl (channels_last), compile (mode "default"), reduce-overhead,
max-autotune. Prints samples/s, the ratio to eager fp32 measured in the same run, and the
compile time. Default variants: fp32, cl, bf16, compile on the CPU; add bf16+cl,
bf16+cl+compile, reduce-overhead, max-autotune on CUDA.
"""

from __future__ import annotations

import argparse
import json

import torch

from gputui.core.config import RunConfig, apply_overrides
from gputui.core.devices import Device
from gputui.train.data import load_dataset, make_batches
from gputui.train.loop import train
from gputui.train.strategies import fastpath
from gputui.train.strategies.single import Single

MODES = {"compile": "default", "reduce-overhead": "reduce-overhead",
         "max-autotune": "max-autotune"}


def settings(variant: str) -> dict:
    out = {"run.precision": "fp32", "run.compile": "off", "run.channels_last": False}
    for part in variant.split("+"):
        if part in ("fp32", "bf16", "fp16"):
            out["run.precision"] = part
        elif part == "cl":
            out["run.channels_last"] = True
        elif part in MODES:
            out["run.compile"] = MODES[part]
        else:
            raise SystemExit(f"unknown variant part {part!r} in {variant!r}")
    return out


def measure(variant: str, base: dict, ds, device: Device) -> tuple[float, float]:
    """(steady samples/s, compile seconds) of one variant."""
    cfg = apply_overrides(RunConfig(), [("bench", k, v)
                                        for k, v in {**base, **settings(variant)}.items()])
    strategy = Single(cfg, [device], ds.in_channels, ds.image_size, ds.num_classes)
    strategy.setup()
    batches = make_batches(ds, strategy.batch_size, cfg.run.seed, strategy.data_device(),
                           channels_last=cfg.run.channels_last)
    compile_s = fastpath.compile_ahead(strategy, ds, lambda ev: print(f"  {variant}: {ev.message}"))
    ends = []
    train(cfg, strategy, batches, ds, lambda ev: ends.append(ev) if ev.kind == "epoch_end"
          else None, lambda: False)
    steady = ends[1:]
    return sum(e.samples_per_s * e.seconds for e in steady) / sum(e.seconds for e in steady), \
        compile_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", choices=("lenet", "resnet18", "mlp"), default="lenet")
    ap.add_argument("--variants")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--train-size", type=int, default=12_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    device = Device(args.device, 0)
    default = "fp32,cl,bf16,compile" if args.device == "cpu" else \
        "fp32,cl,bf16,bf16+cl,compile,bf16+cl+compile,reduce-overhead,bf16+cl+reduce-overhead," \
        "max-autotune"
    variants = (args.variants or default).split(",")
    base = {"run.epochs": args.epochs, "optim.batch_size": args.batch_size,
            "model.name": args.model, "model.init": "default", "optim.momentum": 0.9,
            "run.log_every": 20, "run.checkpoint": False}
    ds = load_dataset("synthetic", train_size=args.train_size, test_size=2_000)
    results = {}
    for variant in ["fp32", *[v for v in variants if v != "fp32"]]:
        sps, compile_s = measure(variant, base, ds, device)
        results[variant] = {"samples_per_s": sps, "compile_s": compile_s}
        print(f"{variant:28} {sps:10,.0f} samples/s  x{sps / results['fp32']['samples_per_s']:.2f}"
              f"  compile {compile_s:.1f} s", flush=True)
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else \
        f"CPU, {args.threads} threads"
    print(f"({args.model}, batch {args.batch_size}, {where}, torch {torch.__version__}; ratios "
          f"to eager fp32 in this run)")
    if args.json:
        print(json.dumps({"device": where, "results": results}))


if __name__ == "__main__":
    main()
