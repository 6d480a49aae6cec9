"""gputui's `single` strategy against an independent hand-written loop (benchmarks/plain.py).

    .venv/bin/python benchmarks/bench_single.py [--device cpu|cuda] [--rounds 3] [--epochs 3]
        [--threads 2] [--batch-size 256] [--train-size 12000]

The plain loop has its own LeNet and its own batching (nothing of gputui's), on the same
synthetic tensors, the same seed and the same batch order, so both do the same arithmetic: the
benchmark checks that their parameters agree at the end. Both run in this process,
alternating (A B A B ...), with the data resident on ``--device``. Each round trains
``--epochs`` epochs; the first is warm-up and is not counted; samples/s is training time only
(evaluation excluded). Prints each round, the medians and the ratio gputui / plain (goal: at
least 0.98). On CUDA each epoch ends with a synchronize in both loops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain  # noqa: E402 - the benchmarks' own loop, beside this file

from gputui.core.config import RunConfig, apply_overrides  # noqa: E402
from gputui.core.devices import Device  # noqa: E402
from gputui.train.data import load_dataset, make_batches  # noqa: E402
from gputui.train.loop import train  # noqa: E402
from gputui.train.strategies.single import Single  # noqa: E402


def gputui_round(cfg: RunConfig, ds, device: Device):
    """(steady samples/s, model) of gputui's loop with the `single` strategy."""
    strategy = Single(cfg, [device], ds.in_channels, ds.image_size, ds.num_classes)
    strategy.setup()
    batches = make_batches(ds, strategy.batch_size, cfg.run.seed, strategy.data_device())
    ends = []
    train(cfg, strategy, batches, ds, lambda ev: ends.append(ev) if ev.kind == "epoch_end"
          else None, lambda: False)
    steady = ends[1:]
    samples = sum(e.samples_per_s * e.seconds for e in steady)
    return samples / sum(e.seconds for e in steady), strategy.model


def plain_round(cfg: RunConfig, ds, device: Device):
    return plain.train(ds.train_x, ds.train_y, torch.device(device.torch_device),
                       cfg.optim.batch_size, cfg.run.epochs, cfg.optim.lr, cfg.optim.momentum,
                       seed=cfg.run.seed)


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pa, pb = list(a.parameters()), list(b.parameters())
    assert len(pa) == len(pb)
    return max((p.detach().cpu() - q.detach().cpu()).abs().max().item() for p, q in zip(pa, pb))


def device_of(name: str) -> Device:
    if name == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device here")
        return Device("cuda", 0)
    return Device("cpu", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--train-size", type=int, default=12_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = device_of(args.device)
    cfg = apply_overrides(RunConfig(), [
        ("bench", "run.epochs", args.epochs), ("bench", "optim.batch_size", args.batch_size),
        ("bench", "model.init", "default"), ("bench", "optim.momentum", 0.9),
        ("bench", "run.log_every", 20), ("bench", "run.checkpoint", False)])
    ds = load_dataset("synthetic", train_size=args.train_size, test_size=2_000)
    results: dict[str, list[float]] = {"gputui": [], "plain": []}
    models = {}
    for r in range(args.rounds):
        for name, fn in (("gputui", gputui_round), ("plain", plain_round)):
            sps, models[name] = fn(cfg, ds, device)
            results[name].append(sps)
            print(f"round {r + 1}: {name:7} {sps:10,.0f} samples/s", flush=True)
    diff = max_difference(models["gputui"], models["plain"])
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["gputui"] / med["plain"]
    where = (torch.cuda.get_device_name(0) if device.kind == "cuda"
             else f"CPU, {args.threads} threads")
    print(f"median: gputui {med['gputui']:,.0f} samples/s, plain loop {med['plain']:,.0f} "
          f"samples/s, ratio {ratio:.3f} (goal >= 0.98; LeNet, batch {args.batch_size}, "
          f"{where}, torch {torch.__version__}); final parameters differ by at most {diff:.2g}")
    if args.json:
        print(json.dumps({"gputui": med["gputui"], "plain": med["plain"], "ratio": ratio,
                          "device": where, "max_param_diff": diff}))


if __name__ == "__main__":
    main()
