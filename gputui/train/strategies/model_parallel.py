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
from typing import Any, NamedTuple

import torch
from torch import nn

from gputui.core import breakdown
from gputui.core.config import ConfigError
from gputui.core.mp_plan import balance, check_split_points
from gputui.core.events import DeviceStep, StepReport
from gputui.train.models import count_params
from gputui.train.strategies.base import Strategy, flat_layers
from gputui.train.strategies.meter import Meter
from gputui.train.task import logits_of


class ModelParallel(Strategy):
    """One stage of consecutive layers per device; one optimizer over every stage."""

    name = "model_parallel"
    model: nn.Module  # the whole model, sharing its layers with the stages
    stages: list[nn.Sequential]  # one per device, each on its device (evaluation runs these)
    runners: list[nn.Module]  # what a training step calls: each stage (compiled)
    opt: torch.optim.Optimizer
    chunks: int  # strategy.pipeline_chunks

    def setup(self) -> None:
        n = len(self.devices)
        # The stages share their layers with ``self.model``: its parameter names are exactly
        # single's ("0.0.weight", ...), so it stands for the run in checkpoints and tests.
        self.model = self.build_model()
        label = self.cfg.model.factory or self.cfg.model.name
        layers = stage_blocks(self.model, label)
        cut = cut_blocks(layers, n, self.cfg.strategy.split_points, label, "model_parallel",
                         "devices")
        bounds, counts = cut.bounds, cut.counts
        # each stage runs its blocks' layers flattened (one call per layer)
        self.stages = [nn.Sequential(*flat_layers(nn.Sequential(*layers[a:b]))).to(dev)
                       for a, b, dev in zip(bounds[:-1], bounds[1:], self.torch_devices,
                                          strict=True)]
        self.runners = [self.fast(stage) for stage in self.stages]  # what a training step calls
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.torch_devices[-1])
        self.meter = Meter(self.torch_devices)  # one lane per stage's device
        self.chunks = self.cfg.strategy.pipeline_chunks
        sizes = ", ".join(f"{d.name} {cut.units(a, b)}: {sum(counts[a:b]):,} params"
                          for a, b, d in zip(bounds[:-1], bounds[1:], self.devices, strict=True))
        self.notes.append(f"model_parallel: {label} cut into {n} stages {cut.how}, "
                          f"split points {cut.points}: {sizes}")
        if all(d.kind == "cpu" for d in self.devices):
            self.notes.append(f"{n} CPU virtual devices: each stage is a distinct module on the "
                              f"CPU, run one after another (activation moves cost nothing)")
        if self.chunks > 1 and any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                   for m in self.model.modules()):
            self.notes.append(f"pipeline_chunks = {self.chunks}: BatchNorm computes its batch "
                              f"statistics per chunk, so updates differ slightly from "
                              f"single-device training")

    # ---------------------------------------------------------------- the schedule
    def _send(self, h: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        """Move an activation (or a gradient) from stage ``src``'s device to stage ``dst``'s;
        metered steps time the copy on the source device, where CUDA runs it."""
        with self.meter.lanes[src].comm:
            if self.comm_delay_s and torch.is_grad_enabled():
                time.sleep(self.comm_delay_s)  # debug.comm_delay_s: a slower link, on purpose
            return h.to(self.torch_devices[dst], non_blocking=True)

    def _forward(self, xs, stages: list | None = None):
        """Fill/drain forward of the chunks ``xs``; returns (stage inputs, stage outputs) per
        chunk. While training, each stage input is a fresh leaf, so each stage's backward can
        be run (and timed) on its own and the gradient sent back explicitly."""
        n, c = len(self.stages), len(xs)
        stages = stages or self.runners
        # [chunk][stage]: a slot holds its tensor from the tick that makes it until the
        # backward frees it (None before and after)
        inputs: list[list[Any]] = [[None] * n for _ in range(c)]
        outputs: list[list[Any]] = [[None] * n for _ in range(c)]
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
                    h = self._send(outputs[i][s - 1], s - 1, s)
                    if torch.is_grad_enabled():
                        h = h.detach().requires_grad_()
                inputs[i][s] = h
                with self.meter.lanes[s].compute, self.autocast(self.torch_devices[s]):
                    outputs[i][s] = stages[s](h)
        return inputs, outputs

    def _backward(self, inputs, outputs, losses) -> None:
        """The mirrored drain: at tick t, stage s runs the backward of chunk t - (n-1-s)."""
        n, c = len(self.stages), len(losses)
        for t in range(c + n - 1):
            for s in range(n):
                i = t - (n - 1 - s)
                if not 0 <= i < c:
                    continue
                if s == n - 1:
                    with self.meter.lanes[s].compute:
                        self.backward(losses[i])
                else:
                    grad = self._send(inputs[i][s + 1].grad, s + 1, s)
                    inputs[i][s + 1] = None  # free the activation and its gradient early
                    with self.meter.lanes[s].compute:
                        outputs[i][s].backward(grad)
                outputs[i][s] = None

    def _pipeline(self, x, y, denom: int) -> torch.Tensor:
        """Forward and backward of one micro-batch in ``pipeline_chunks`` chunks."""
        c = min(self.chunks, len(x))
        xs, ys = ((x, ), (y, )) if c == 1 else (torch.tensor_split(x, c), torch.tensor_split(y, c))
        inputs, outputs = self._forward(xs)
        losses = [self.scaled_loss(out[-1], yc, denom) for out, yc in zip(outputs, ys, strict=True)]
        self._backward(inputs, outputs, losses)
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
        m = self.meter.begin(data_s)
        self.opt.zero_grad(set_to_none=True)
        y = y.to(self.torch_devices[-1], non_blocking=True)
        if self.micro == 1:
            loss = self._pipeline(x, y, len(x))
        else:
            k = min(self.micro, len(x))
            parts = [self._pipeline(xm, ym, len(x))
                     for xm, ym in zip(torch.tensor_split(x, k), torch.tensor_split(y, k),
                                       strict=True)]
            loss = torch.stack(parts).sum()
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(x))
        return loss

    def step_report(self) -> StepReport | None:
        """The metered step: each stage's forward+backward compute, its outgoing activation
        and gradient moves as its exposed comm, the update on the first device."""
        m = self.meter
        if not m.measured:
            return None
        step, update = m.step_s(), m.optimizer.seconds()
        computes = [lane.compute.seconds() for lane in m.lanes]
        sends = [lane.comm.seconds() for lane in m.lanes]  # each stage's outgoing moves
        # CPU virtual devices run the stages one after another: each waits for the others
        in_turn = all(d.kind == "cpu" for d in self.devices)
        busy = sum(computes) + sum(sends)
        rows = []
        for d, own, sent in zip(self.devices, computes, sends, strict=True):
            wait = busy - own - sent if in_turn else 0.0
            rows.append(DeviceStep(d.name, samples=m.samples, compute_s=own,
                                   breakdown=breakdown.make(step, m.data_s, own, update, sent,
                                                            0.0, wait)))
        return StepReport(step_s=step, comm_s=sum(sends), devices=tuple(rows))

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The test batch's score: it flows through the stages (in pipeline chunks)."""
        c = min(self.chunks, len(x))
        _, outputs = self._forward(torch.tensor_split(x, c), self.stages)  # eager
        out = torch.cat([logits_of(out[-1]) for out in outputs])
        return self.score(out, y.to(out.device, non_blocking=True))


def stage_blocks(model: nn.Module, label: str,
                 strategy: str = "model_parallel") -> list[nn.Module]:
    """The consecutive blocks model_parallel may cut between: an nn.Sequential's children, or
    what the model's ``gputui_blocks()`` returns (its blocks in forward order: running them one
    after another must be its forward). Anything else is refused with what to provide."""
    if isinstance(model, nn.Sequential):
        return list(model.children())
    declared = getattr(model, "gputui_blocks", None)
    cls = type(model).__name__
    if not callable(declared):
        raise ConfigError(f"strategy '{strategy}' needs the stage boundaries of {label}: "
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


class Cut(NamedTuple):
    """Where a model's blocks are cut into stages."""

    bounds: list[int]  # the block index where each stage starts, then len(blocks)
    counts: list[int]  # parameters per block
    given: bool  # the user's strategy.split_points, not balanced by parameter count
    kinds: tuple[str, ...] = ()  # each block's class name, in order

    def units(self, lo: int, hi: int) -> str:
        """Blocks ``lo`` to ``hi - 1`` in words, by kind: 'blocks 0-2 (Embed, Block x2)' (a
        GPT's blocks are its embedding, its transformer blocks and its head: 'blocks 0-2'
        alone read as three transformer blocks)."""
        where = f"blocks {lo}-{hi - 1}" if hi - lo > 1 else f"block {lo}"
        kinds = self.kinds[lo:hi]
        if not kinds:
            return where
        runs: list[list] = []
        for k in kinds:
            if runs and runs[-1][0] == k:
                runs[-1][1] += 1
            else:
                runs.append([k, 1])
        return where + " (" + ", ".join(k if n == 1 else f"{k} x{n}" for k, n in runs) + ")"

    @property
    def points(self) -> list[int]:
        return self.bounds[1:-1]

    @property
    def how(self) -> str:
        return "at strategy.split_points" if self.given else "balanced by parameter count"


def cut_blocks(blocks: list[nn.Module], n: int, given: list, label: str, strategy: str,
               unit: str) -> Cut:
    """The cut of ``blocks`` into ``n`` stages: at the user's split points, or where the
    parameter count balances; refused in one line when the blocks cannot make ``n`` stages or
    the points do not fit them."""
    if n > len(blocks):
        raise ConfigError(f"strategy '{strategy}' cuts {label} into at most {len(blocks)} "
                          f"stages (one per block), {n} {unit} given; use fewer devices")
    counts = [count_params(b) for b in blocks]
    points = list(given) or balance(counts, n)
    reason = check_split_points(points, len(blocks), n, label)
    if reason:
        raise ConfigError(reason)
    return Cut([0, *points, len(blocks)], counts, bool(given),
               tuple(type(b).__name__ for b in blocks))


STRATEGY = ModelParallel
