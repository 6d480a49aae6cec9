"""gputui's `single` strategy on the GPT against a plain PyTorch loop of the same model.

    .venv/bin/python benchmarks/bench_lm.py [--device cpu|cuda] [--rounds 3] [--epochs 3]
        [--threads 2] [--batch-size 16] [--train-size 256] [--context 128] [--n-layer 4]
        [--n-embd 128] [--n-head 4] [--precision fp32|bf16] [--compile]

Both train ``gputui.train.gpt`` built from the same seed on the same pystdlib windows in the
same batch order (``epoch_permutation``'s formula, written out again in the plain loop), with
SGD and momentum 0.9, so they do the same arithmetic: the benchmark checks that their final
parameters agree. The plain loop is what one writes by hand: index the resident tensors, forward,
cross-entropy over every position, zero_grad, backward, step, a ``.item()`` every 20 steps
(gputui's log interval). Both run in this process, alternating (A B A B ...), with the data
on ``--device``. Each round trains ``--epochs`` epochs; the first is warm-up and is not
counted; tokens/s is training time only (evaluation excluded). Prints each round, the medians
and the ratio gputui / plain (goal: at least 0.95). On CUDA each epoch ends with a
synchronize in both loops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gputui.core.config import RunConfig, apply_overrides  # noqa: E402
from gputui.core.devices import Device  # noqa: E402
from gputui.train.data import make_batches  # noqa: E402
from gputui.train.gpt import GPTShape, gpt  # noqa: E402
from gputui.train.loop import train  # noqa: E402
from gputui.train.strategies.single import Single  # noqa: E402
from gputui.train.text import load_text  # noqa: E402

LOG_EVERY = 20


def gputui_round(cfg: RunConfig, ds, device: Device):
    """(steady tokens/s, model) of gputui's loop with the `single` strategy."""
    strategy = Single(cfg, [device], ds.in_channels, ds.image_size, ds.num_classes)
    strategy.setup()
    batches = make_batches(ds, strategy.batch_size, cfg.run.seed, strategy.data_device())
    ends = []
    train(cfg, strategy, batches, ds, lambda ev: ends.append(ev) if ev.kind == "epoch_end"
          else None, lambda: False)
    steady = ends[1:]
    tokens = sum(e.tokens_per_s * e.seconds for e in steady)
    return tokens / sum(e.seconds for e in steady), strategy.model


def plain_round(cfg: RunConfig, ds, device: Device):
    """(steady tokens/s, model) of a hand-written loop over the same model and batches."""
    dev = torch.device(device.torch_device)
    m, o = cfg.model, cfg.optim
    shape = GPTShape(256, cfg.data.context, m.n_layer, m.n_head, m.n_embd, m.tie)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed)
        model = gpt(shape)
    model = model.to(dev)
    step_fn = torch.compile(model) if cfg.run.compile != "off" else model
    opt = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)
    x, y = ds.train_x.to(dev), ds.train_y.to(dev)
    b = o.batch_size
    steps = len(x) // b
    amp = {"bf16": torch.bfloat16}.get(cfg.run.precision)
    seconds = []
    for epoch in range(1, cfg.run.epochs + 1):
        gen = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(x), generator=gen).to(dev)
        t0 = time.perf_counter()
        for i in range(steps):
            idx = perm[i * b:(i + 1) * b]
            xb, yb = x[idx], y[idx]
            with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                logits = step_fn(xb)
            loss = F.cross_entropy(logits.float().view(-1, 256), yb.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (i + 1) % LOG_EVERY == 0 or i + 1 == steps:
                loss.item()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds.append(time.perf_counter() - t0)
    steady = seconds[1:]
    return steps * b * cfg.data.context * len(steady) / sum(steady), model


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pa, pb = list(a.parameters()), list(b.parameters())
    assert len(pa) == len(pb)
    return max((p.detach().cpu() - q.detach().cpu()).abs().max().item() for p, q in zip(pa, pb))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--train-size", type=int, default=256, help="windows per epoch")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile both (default mode)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    device = Device("cuda", 0) if args.device == "cuda" else Device("cpu", 0)
    cfg = apply_overrides(RunConfig(), [
        ("bench", "run.epochs", args.epochs), ("bench", "optim.batch_size", args.batch_size),
        ("bench", "optim.lr", 0.05), ("bench", "optim.momentum", 0.9),
        ("bench", "model.name", "gpt"), ("bench", "data.name", "pystdlib"),
        ("bench", "data.context", args.context), ("bench", "model.n_layer", args.n_layer),
        ("bench", "model.n_head", args.n_head), ("bench", "model.n_embd", args.n_embd),
        ("bench", "run.precision", args.precision),
        ("bench", "run.compile", "default" if args.compile else "off"),
        ("bench", "run.log_every", LOG_EVERY), ("bench", "run.checkpoint", False)])
    ds = load_text("pystdlib", "", args.context, train_size=args.train_size, test_size=16)
    results: dict[str, list[float]] = {"gputui": [], "plain": []}
    models = {}
    for r in range(args.rounds):
        for name, fn in (("gputui", gputui_round), ("plain", plain_round)):
            tps, models[name] = fn(cfg, ds, device)
            results[name].append(tps)
            print(f"round {r + 1}: {name:7} {tps:12,.0f} tokens/s", flush=True)
    diff = max_difference(models["gputui"], models["plain"])
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["gputui"] / med["plain"]
    where = (torch.cuda.get_device_name(0) if device.kind == "cuda"
             else f"CPU, {args.threads} threads")
    params = sum(p.numel() for p in models["plain"].parameters())
    print(f"median: gputui {med['gputui']:,.0f} tokens/s, plain loop {med['plain']:,.0f} "
          f"tokens/s, ratio {ratio:.3f} (goal >= 0.95; GPT {params:,} parameters, context "
          f"{args.context}, batch {args.batch_size}, {args.precision}"
          f"{', compiled' if args.compile else ''}, {where}, torch {torch.__version__}); "
          f"final parameters differ by at most {diff:.2g}")
    if args.json:
        print(json.dumps({"gputui": med["gputui"], "plain": med["plain"], "ratio": ratio,
                          "device": where, "max_param_diff": diff}))


if __name__ == "__main__":
    main()
