"""``model_parallel``: consecutive layers on different devices, optionally pipelined.

The model's top-level blocks are cut into consecutive stages, one per device (balanced by
parameter count, or at ``strategy.split_points``). Activations move to the next stage's device
in forward and their gradients move back in backward. With ``strategy.pipeline_chunks = k``
each (micro-)batch is cut into k chunks that flow through the stages GPipe-style: every
forward on a fill/drain schedule (at tick t, stage s works on chunk t - s), then every
backward on the mirrored schedule. On CUDA the host only queues work and the copies are
non_blocking, so stage s computes chunk c while stage s+1 computes chunk c-1, as in PyTorch's
model-parallel tutorial. On CPU virtual devices every stage is a distinct module on the CPU and
the schedule simply runs in order.

Each chunk's loss is summed and divided by the global batch, so the update equals the
single-device one; BatchNorm is the exception, its batch statistics being per chunk.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from gputui.core import breakdown
from gputui.core.config import ConfigError
from gputui.core.mp_plan import balance, check_split_points
from gputui.train.models import count_params
from gputui.train.strategies.base import Stopwatch, Strategy, flat_layers
from gputui.train.task import logits_of


class ModelParallel(Strategy):
    """One stage of consecutive layers per device; one optimizer over every stage."""

    name = "model_parallel"
    model: nn.Module  # the whole model, sharing its layers with the stages
    stages: list[nn.Sequential]  # one per device, each on its device (evaluation runs these)
    runners: list[nn.Module]  # what a training step calls: each stage (compiled)
    opt: torch.optim.Optimizer
    watches: list[Stopwatch]
    chunks: int  # strategy.pipeline_chunks

    def setup(self) -> None:
        n = len(self.devices)
        # The stages share their layers with ``self.model``: its parameter names are exactly
        # single's ("0.0.weight", ...), so it stands for the run in checkpoints and tests.
        self.model = self.build_model()
        label = self.cfg.model.factory or self.cfg.model.name
        layers = stage_blocks(self.model, label)
        if n > len(layers):
            raise ConfigError(f"strategy 'model_parallel' cuts {label} into at most "
                              f"{len(layers)} stages (one per block), {n} devices given; use "
                              f"fewer devices")
        counts = [count_params(layer) for layer in layers]
        given = list(self.cfg.strategy.split_points)
        points = given or balance(counts, n)
        reason = check_split_points(points, len(layers), n, label)
        if reason:
            raise ConfigError(reason)
        bounds = [0, *points, len(layers)]
        # each stage runs its blocks' layers flattened (one call per layer)
        self.stages = [nn.Sequential(*flat_layers(nn.Sequential(*layers[a:b]))).to(dev)
                       for a, b, dev in zip(bounds[:-1], bounds[1:], self.torch_devices,
                                          strict=True)]
        self.runners = [self.fast(stage) for stage in self.stages]  # what a training step calls
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.torch_devices[-1])
        self.watches = [Stopwatch(dev) for dev in self.torch_devices]
        self.chunks = self.cfg.strategy.pipeline_chunks
        how = "at strategy.split_points" if given else "balanced by parameter count"
        sizes = ", ".join(f"{d.name} layers {a}-{b - 1} ({sum(counts[a:b]):,} params)"
                          for a, b, d in zip(bounds[:-1], bounds[1:], self.devices, strict=True))
        self.notes.append(f"model_parallel: {label} cut into {n} stages {how}, "
                          f"split points {points}: {sizes}")
        if all(d.kind == "cpu" for d in self.devices):
            self.notes.append(f"{n} CPU virtual devices: each stage is a distinct module on the "
                              f"CPU, run one after another (activation moves cost nothing)")
        if self.chunks > 1 and any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                   for m in self.model.modules()):
            self.notes.append(f"pipeline_chunks = {self.chunks}: BatchNorm computes its batch "
                              f"statistics per chunk, so updates differ slightly from "
                              f"single-device training")

    # ---------------------------------------------------------------- the schedule
    def _send(self, h: torch.Tensor, src: int, dst: int, comm: list | None) -> torch.Tensor:
        """Move an activation (or a gradient) from stage ``src``'s device to stage ``dst``'s;
        metered steps time the copy on the source device, where CUDA runs it."""
        begin = self.watches[src].mark() if comm is not None else None
        if self.comm_delay_s and torch.is_grad_enabled():
            time.sleep(self.comm_delay_s)  # debug.comm_delay_s: a slower link, on purpose
        out = h.to(self.torch_devices[dst], non_blocking=True)
        if comm is not None:
            comm.append((src, begin, self.watches[src].mark()))
        return out

    def _forward(self, xs, meter: dict | None, stages: list | None = None):
        """Fill/drain forward of the chunks ``xs``; returns (stage inputs, stage outputs) per
        chunk. While training, each stage input is a fresh leaf, so each stage's backward can
        be run (and timed) on its own and the gradient sent back explicitly."""
        n, c = len(self.stages), len(xs)
        stages = stages or self.runners
        # [chunk][stage]: a slot holds its tensor from the tick that makes it until the
        # backward frees it (None before and after)
        inputs: list[list[Any]] = [[None] * n for _ in range(c)]
        outputs: list[list[Any]] = [[None] * n for _ in range(c)]
        comm = meter["comm"] if meter else None
        for t in range(c + n - 1):
            # Downstream stages first: their inputs are ready, and on CUDA their kernels are
            # queued before the upstream stage's next chunk, so the devices overlap.
            for s in reversed(range(n)):
                i = t - s
                if not 0 <= i < c:
                    continue
                if s == 0:
                    h = xs[i]
                else:
                    h = self._send(outputs[i][s - 1], s - 1, s, comm)
                    if torch.is_grad_enabled():
                        h = h.detach().requires_grad_()
                inputs[i][s] = h
                begin = self.watches[s].mark() if meter else None
                with self.autocast(self.torch_devices[s]):
                    outputs[i][s] = stages[s](h)
                if meter:
                    meter["compute"][s].append((begin, self.watches[s].mark()))
        return inputs, outputs

    def _backward(self, inputs, outputs, losses, meter: dict | None) -> None:
        """The mirrored drain: at tick t, stage s runs the backward of chunk t - (n-1-s)."""
        n, c = len(self.stages), len(losses)
        comm = meter["comm"] if meter else None
        for t in range(c + n - 1):
            for s in range(n):
                i = t - (n - 1 - s)
                if not 0 <= i < c:
                    continue
                if s == n - 1:
                    begin = self.watches[s].mark() if meter else None
                    self.backward(losses[i])
                else:
                    grad = self._send(inputs[i][s + 1].grad, s + 1, s, comm)
                    inputs[i][s + 1] = None  # free the activation and its gradient early
                    begin = self.watches[s].mark() if meter else None
                    outputs[i][s].backward(grad)
                outputs[i][s] = None
                if meter:
                    meter["compute"][s].append((begin, self.watches[s].mark()))

    def _pipeline(self, x, y, denom: int, meter: dict | None) -> torch.Tensor:
        """Forward and backward of one micro-batch in ``pipeline_chunks`` chunks."""
        c = min(self.chunks, len(x))
        xs, ys = ((x, ), (y, )) if c == 1 else (torch.tensor_split(x, c), torch.tensor_split(y, c))
        inputs, outputs = self._forward(xs, meter)
        losses = [self.scaled_loss(out[-1], yc, denom) for out, yc in zip(outputs, ys, strict=True)]
        self._backward(inputs, outputs, losses, meter)
        if c == 1:
            return losses[0].detach()
        return torch.stack([loss.detach() for loss in losses]).sum()

    # ---------------------------------------------------------------- the interface
    def models(self) -> list[nn.Module]:
        """The whole model (its layers live on the stages' devices)."""
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        meter = None
        if data_s is not None:
            meter = {"start": self.watches[0].mark(), "comm": [],
                     "compute": [[] for _ in self.stages]}
        self.opt.zero_grad(set_to_none=True)
        y = y.to(self.torch_devices[-1], non_blocking=True)
        if self.micro == 1:
            loss = self._pipeline(x, y, len(x), meter)
        else:
            k = min(self.micro, len(x))
            parts = [self._pipeline(xm, ym, len(x), meter)
                     for xm, ym in zip(torch.tensor_split(x, k), torch.tensor_split(y, k),
                                       strict=True)]
            loss = torch.stack(parts).sum()
        if meter is not None:
            meter["update"] = self.watches[0].mark()
        self.optimizer_step(self.opt)
        if meter is not None:
            meter["end"], meter["samples"] = self.watches[0].mark(), len(x)
            meter["data_s"] = data_s
            self.timing = meter
        return loss

    def read_timing(self) -> dict:
        """Seconds of the metered step: each stage's forward+backward compute, the activation
        and gradient transfers between stages as comm, and the whole step."""
        if not self.timing:
            return {}
        t = self.timing
        first = self.watches[0]
        step, update = first.seconds(t["start"], t["end"]), first.seconds(t["update"], t["end"])
        computes = [sum(w.seconds(a, b) for a, b in marks)
                    for w, marks in zip(self.watches, t["compute"], strict=True)]
        sends = [0.0] * len(self.stages)  # each stage's outgoing moves: its exposed comm
        for src, a, b in t["comm"]:
            sends[src] += self.watches[src].seconds(a, b)
        # CPU virtual devices run the stages one after another: each waits for the others
        in_turn = all(d.kind == "cpu" for d in self.devices)
        busy = sum(computes) + sum(sends)
        per_device = []
        for d, own, sent in zip(self.devices, computes, sends, strict=True):
            wait = busy - own - sent if in_turn else 0.0
            per_device.append({"device": d.name, "samples": t["samples"], "compute_s": own,
                               "breakdown": breakdown.make(step, t["data_s"], own, update,
                                                           sent, 0.0, wait)})
        return {"step_s": step, "comm_s": sum(sends), "per_device": per_device}

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The test batch's score: it flows through the stages (in pipeline chunks)."""
        c = min(self.chunks, len(x))
        _, outputs = self._forward(torch.tensor_split(x, c), None, self.stages)  # eager
        out = torch.cat([logits_of(out[-1]) for out in outputs])
        return self.score(out, y.to(out.device, non_blocking=True))


def stage_blocks(model: nn.Module, label: str) -> list[nn.Module]:
    """The consecutive blocks model_parallel may cut between: an nn.Sequential's children, or
    what the model's ``gputui_blocks()`` returns (its blocks in forward order: running them one
    after another must be its forward). Anything else is refused with what to provide."""
    if isinstance(model, nn.Sequential):
        return list(model.children())
    declared = getattr(model, "gputui_blocks", None)
    cls = type(model).__name__
    if not callable(declared):
        raise ConfigError(f"strategy 'model_parallel' needs the stage boundaries of {label}: "
                          f"it built a {cls}, not an nn.Sequential; return an nn.Sequential of "
                          f"blocks, or give {cls} a gputui_blocks() method returning its blocks "
                          f"in forward order")
    blocks = list(declared())
    if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
        raise ConfigError(f"{cls}.gputui_blocks() must return a non-empty list of nn.Modules")
    covered = {id(p) for b in blocks for p in b.parameters()}
    left = [name for name, p in model.named_parameters() if id(p) not in covered]
    if left:
        raise ConfigError(f"{cls}.gputui_blocks() leaves out parameters ({', '.join(left[:3])}"
                          f"); its blocks must hold every parameter of the model")
    return blocks


STRATEGY = ModelParallel
