"""``scratch``: data parallelism written out by hand, exactly as the material does it.

A distinct copy of the parameters lives on every device; each global batch is split over the
devices (evenly, or by ``split_weights``); every replica runs forward and backward on its
shard with the loss summed and divided by the global batch size, so uneven shards still add
up to the full-batch gradient; ``allreduce`` sums the gradients on the first device and
copies the sum back to every other; then every replica takes the same optimizer step (its own
optimizer on the same gradients: the same lr, the same clipping, the same state).
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from gputui.core import breakdown
from gputui.core.errors import UserError
from gputui.core.events import DeviceStep, StepReport
from gputui.train.strategies.base import Strategy
from gputui.train.strategies.meter import Meter


class ReplicaMismatch(UserError, RuntimeError):
    """check_replicas found a replica that no longer equals the first."""


def split_sizes(total: int, n: int, weights: list[float] | None = None) -> list[int]:
    """Shard sizes summing to ``total``: as even as possible, or proportional to ``weights``
    (largest remainder), every shard at least one example."""
    weights = list(weights) if weights else [1.0] * n
    exact = [total * w / sum(weights) for w in weights]
    sizes = [max(1, int(e)) for e in exact]
    order = sorted(range(n), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(sizes) < total:
        sizes[order[i % n]] += 1
        i += 1
    while sum(sizes) > total:  # only when max(1, .) rounded a tiny share up
        j = max(range(n), key=lambda k: sizes[k])
        sizes[j] -= 1
    return sizes


def allreduce(data: list[torch.Tensor]) -> None:
    """Sum the tensors into the first, then copy the sum back to the others (the material's)."""
    for i in range(1, len(data)):
        data[0].add_(data[i].to(data[0].device, non_blocking=True))
    for i in range(1, len(data)):
        data[i].copy_(data[0], non_blocking=True)


class Scratch(Strategy):
    """One replica and one optimizer per device; gradients all-reduced by hand."""

    name = "scratch"
    replicas: list[nn.Module]  # one per device, distinct copies
    steppers: list[nn.Module]  # what a step calls: each replica flattened (and compiled)
    params: list[list[nn.Parameter]]  # each replica's parameters, in the same order
    opts: list[torch.optim.Optimizer]  # one per replica
    weights: list[float] | None  # strategy.split_weights
    _sizes: dict[int, list[int]]  # batch size -> shard sizes, computed once

    def setup(self) -> None:
        master = self.build_model()
        # deepcopy, not .to(): on one physical device .to() would return the same tensors, the
        # replicas would alias, and the allreduce would add a gradient to itself.
        self.replicas = [copy.deepcopy(master).to(dev) for dev in self.torch_devices]
        self.steppers = [self.fast(self.lean(r)) for r in self.replicas]  # what a step calls
        self.params = [list(r.parameters()) for r in self.replicas]
        self.opts = [self.make_optimizer(p) for p in self.params]
        self.make_scaler(self.torch_devices[0])
        self.meter = Meter(self.torch_devices)  # one lane per replica's device
        self.weights = self.cfg.strategy.split_weights or None
        self._sizes = {}
        if all(d.kind == "cpu" for d in self.devices) and len(self.devices) > 1:
            self.notes.append(f"{len(self.devices)} CPU virtual devices: distinct replicas "
                              f"on the CPU, run one after another")

    def models(self) -> list[nn.Module]:
        return list(self.replicas)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self.opts)

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        total = len(x)
        sizes = self._sizes.get(total)
        if sizes is None:
            sizes = self._sizes[total] = split_sizes(total, len(self.replicas), self.weights)
        xs, ys = torch.split(x, sizes), torch.split(y, sizes)
        m = self.meter.begin(data_s)
        loss: torch.Tensor | None = None
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        for i, (model, dev) in enumerate(zip(self.steppers, self.torch_devices, strict=True)):
            with m.lanes[i].compute:  # on device i's clock
                part = self.forward_backward(model, xs[i].to(dev, non_blocking=True),
                                             ys[i].to(dev, non_blocking=True), total, dev)
                loss = part if loss is None else loss + part.to(loss.device)
        with m.comm:
            if self.comm_delay_s:
                time.sleep(self.comm_delay_s)  # debug.comm_delay_s: a slower link, on purpose
            with torch.no_grad():
                for grads in zip(*[[p.grad for p in params] for params in self.params],
                                 strict=True):
                    allreduce(list(grads))
        with m.optimizer:
            self.optimizer_step(*self.opts)
        m.finish(samples=total)
        assert loss is not None  # one replica at least
        if self.cfg.strategy.check_replicas:
            self.check_replicas()
        return loss

    def step_report(self) -> StepReport | None:
        """The metered step: each device's compute, the allreduce (every device's exposed
        comm), the update on the first device."""
        m = self.meter
        if not m.measured:
            return None
        step, comm, update = m.step_s(), m.comm.seconds(), m.optimizer.seconds()
        computes = [lane.compute.seconds() for lane in m.lanes]
        # CPU virtual devices run one after another: each waits while the others compute
        in_turn = all(d.kind == "cpu" for d in self.devices)
        rows = []
        for d, size, own in zip(self.devices, self._sizes[m.samples], computes, strict=True):
            wait = sum(computes) - own if in_turn else 0.0
            rows.append(DeviceStep(d.name, samples=size, compute_s=own, breakdown=breakdown.make(
                step, m.data_s, own, update, comm, 0.0, wait)))
        return StepReport(step_s=step, comm_s=comm, devices=tuple(rows))

    @torch.no_grad()
    def check_replicas(self) -> None:
        """Raise ReplicaMismatch unless every replica equals the first, parameter by parameter."""
        names = [name for name, _ in self.replicas[0].named_parameters()]
        for r, params in enumerate(self.params[1:], start=1):
            for name, p0, p in zip(names, self.params[0], params, strict=True):
                if not torch.equal(p0, p.to(p0.device)):
                    diff = (p0 - p.to(p0.device)).abs().max().item()
                    raise ReplicaMismatch(f"replica {r} differs from replica 0 in '{name}' "
                                          f"(max |difference| {diff:.3g})")

    def state_dict(self) -> dict:
        """The first replica and its optimizer only: every replica is the same (the equivalence
        tests and check_replicas hold them to it), so a checkpoint need not hold N copies."""
        return {"models": [self.replicas[0].state_dict()],
                "optimizers": [self.opts[0].state_dict()], "scaler": self.scaler_state()}

    def load_state_dict(self, state: dict) -> None:
        """Load the saved replica into every replica (and its optimizer state into every
        optimizer, each its own copy: on one device ``.to()`` would share the momentum buffers
        and every replica's step would update them)."""
        for model, opt in zip(self.replicas, self.opts, strict=True):
            model.load_state_dict(state["models"][0])
            opt.load_state_dict(copy.deepcopy(state["optimizers"][0]))
        self.load_scaler_state(state)


STRATEGY = Scratch
