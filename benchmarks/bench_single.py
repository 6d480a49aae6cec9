"""gputui's `single` strategy against a plain PyTorch loop: same model, batch, data, threads.

    .venv/bin/python benchmarks/bench_single.py [--rounds 3] [--epochs 3] [--threads 2]

Both run in this process, alternating (A B A B ...), on the same synthetic tensors and the
same batch order. Each round trains ``--epochs`` epochs; the first is warm-up and is not
counted. Steady-state samples/s is training time only (evaluation excluded). Prints each
round, the medians and the ratio gputui / plain (target: at least 0.99).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.nn import functional as F

from gputui.config import RunConfig, apply_overrides
from gputui.devices import cpu_devices
from gputui.training.data import TensorBatches, load_dataset
from gputui.training.loop import train
from gputui.training.models import build_model
from gputui.training.strategies.single import Single


def gputui_round(cfg: RunConfig, ds, epochs: int) -> float:
    """Steady-state samples/s of gputui's loop with the `single` strategy."""
    strategy = Single(cfg, cpu_devices(1), ds.in_channels, ds.image_size, ds.num_classes)
    strategy.setup()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed)
    ends = []
    train(cfg, strategy, batches, ds, lambda ev: ends.append(ev) if ev.kind == "epoch_end" else None,
          lambda: False)
    steady = ends[1:]
    samples = sum(e.samples_per_s * e.seconds for e in steady)
    return samples / sum(e.seconds for e in steady)


def plain_round(cfg: RunConfig, ds, epochs: int) -> float:
    """Steady-state samples/s of a hand-written loop: zero_grad, forward, loss, backward, step."""
    model = build_model("lenet", 1, 28, 10, seed=cfg.run.seed, init=cfg.model.init)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum)
    batches = TensorBatches(ds.train_x, ds.train_y, cfg.optim.batch_size, cfg.run.seed)
    seconds, samples = 0.0, 0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        total = torch.zeros(())
        for x, y in batches.epoch(epoch):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += loss.detach()
        total.item()
        if epoch > 1:
            seconds += time.perf_counter() - start
            samples += batches.steps_per_epoch * cfg.optim.batch_size
    return samples / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = apply_overrides(RunConfig(), [
        ("bench", "run.epochs", args.epochs), ("bench", "optim.batch_size", args.batch_size),
        ("bench", "model.init", "default"), ("bench", "optim.momentum", 0.9),
        ("bench", "run.log_every", 20)])
    ds = load_dataset("synthetic", train_size=12_000, test_size=2_000)
    results: dict[str, list[float]] = {"gputui": [], "plain": []}
    for r in range(args.rounds):
        for name, fn in (("gputui", gputui_round), ("plain", plain_round)):
            sps = fn(cfg, ds, args.epochs)
            results[name].append(sps)
            print(f"round {r + 1}: {name:7} {sps:8,.0f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["gputui"] / med["plain"]
    print(f"median: gputui {med['gputui']:,.0f} samples/s, plain loop {med['plain']:,.0f} "
          f"samples/s, ratio {ratio:.3f} (LeNet, batch {args.batch_size}, {args.threads} threads)")
    if args.json:
        print(json.dumps({"gputui": med["gputui"], "plain": med["plain"], "ratio": ratio}))


if __name__ == "__main__":
    main()
