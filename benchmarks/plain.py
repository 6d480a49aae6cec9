"""A hand-written training loop for the benchmarks, independent of gputui's code.

Its own LeNet (the same layers in the same order, so ``torch.manual_seed(seed)`` gives the same
initial parameters as gputui's ``model.init = "default"``), its own batching (each epoch's
order from the same seeded permutation, the set shuffled once per epoch and cut into
contiguous batches, the leanest way a hand-written loop feeds in-memory tensors), and the
textbook step: zero_grad, forward, mean cross-entropy, backward, step. Nothing else runs per
step; the loss is read once per epoch.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional as F


def lenet(seed: int) -> nn.Sequential:
    """LeNet as the benchmarks' plain loop writes it: one flat Sequential."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))


def order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's permutation (the same seeding rule as the runs it is compared with)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(x: torch.Tensor, y: torch.Tensor, device: torch.device, batch: int, epochs: int,
          lr: float, momentum: float, seed: int = 0, shard: tuple[int, int] | None = None,
          wrap=None) -> tuple[float, nn.Module]:
    """Train ``epochs`` epochs; returns (samples/s over the epochs after the first, model).
    ``shard = (rank, world)`` trains on that rank's slice of each global batch (a plain DDP
    loop, the model wrapped by ``wrap``); the samples counted are then the global batch's."""
    x, y = x.to(device), y.to(device)
    model = lenet(seed).to(device)
    run = wrap(model) if wrap is not None else model
    opt = torch.optim.SGD(run.parameters(), lr=lr, momentum=momentum)
    steps = len(x) // batch
    lo, hi = 0, batch
    if shard is not None:
        rank, world = shard
        lo, hi = rank * batch // world, (rank + 1) * batch // world
    seconds, samples = 0.0, 0
    for epoch in range(1, epochs + 1):
        sync(device)
        start = time.perf_counter()
        perm = order(len(x), seed, epoch)[:steps * batch].to(device)
        xs, ys = x[perm], y[perm]
        loss = None
        for i in range(steps):
            xb, yb = xs[i * batch + lo:i * batch + hi], ys[i * batch + lo:i * batch + hi]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(run(xb), yb)
            loss.backward()
            opt.step()
        if loss is not None:
            loss.item()
        if epoch > 1:
            seconds += time.perf_counter() - start
            samples += steps * batch
    return samples / max(seconds, 1e-9), model
