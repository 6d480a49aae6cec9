"""The common interface of every strategy, and what single-device training already does.

What the loop (and the worker, checkpoints, the memory and FLOP figures, the fast path) calls
on a strategy, and nothing else:

- ``setup()`` once, then ``data_device()`` (where the batches go); ``compiles()`` and, after
  a failed compile, ``use_eager()`` (the fast path);
- ``train_step(x, y, data_s=None)``: one optimizer step on a global batch. The step is
  metered when ``data_s`` (the seconds the loop waited for the batch) is given;
  ``step_report()`` reports the last metered step, at the log interval;
- ``set_train(mode)`` and ``evaluate(x, y)`` around the test batches; ``reduce_metric(v)``;
- ``device_memory()``, ``memory_rows(activations)``, ``memory_groups()``, ``build_model()``
  (the memory and FLOP figures);
- ``models()``, ``optimizers()``, ``primary_model()``, ``state_dict()``,
  ``load_state_dict(state)`` (checkpoints, the fast path, tests), ``close()``;
- multi-process strategies only: ``agree_stop(code)`` (the worker's agreed stop, with its reason);
- read-only: ``cfg``, ``devices``, ``name``, ``rank``, ``local_rank``, ``world_size``,
  ``batch_size``, ``lr`` (the base lr) and ``notes`` (what the run should say once, at its
  start); ``updater`` (the lr schedule, clipping and optimizer-step count, see
  ``gputui.train.optim``), whose ``plan(total, done)`` the loop calls before the first step.

Nothing outside a strategy writes to it: its state (models, optimizers, the grad scaler,
its meter) is its own. A subclass holds only what differs from single-device training: it
builds its models in ``setup()`` (every attribute it creates there is declared on the class),
says which ``models()`` and ``optimizers()`` it trains, in checkpoint order, and writes
``train_step``; the loss, backward, update and evaluation it shares live here once.

Measuring a step (``gputui.train.strategies.meter``). ``setup()`` makes ``self.meter =
Meter(devices)`` over the devices the process drives; ``train_step`` is written once and
wraps its parts in the meter's spans, which mark only on the steps the loop meters::

    def train_step(self, x, y, data_s=None):
        m = self.meter.begin(data_s)
        self.opt.zero_grad(set_to_none=True)
        with m.compute:
            loss = self.forward_backward(self.model, x, y, len(x), self.device)
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(x))
        return loss

Communication goes in ``with m.comm:`` (or ``m.lanes[i].comm`` for device i), or is marked
by a hook (``comm_timer.CommTimer``); a device other than the first has its compute in
``m.lanes[i].compute``. The default ``step_report`` turns the meter into the frozen
``gputui.core.events.StepReport`` for one device: compute, the update, exposed communication
(``m.comm``, none hidden), data and host. A strategy whose devices or communication differ
writes its own ``step_report`` from the same spans (dp, scratch, model_parallel; the rank
strategies' is ``rank.gather_steps``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gputui.core import breakdown
from gputui.core.config import RunConfig, effective_batch_size, effective_lr, task_of
from gputui.core.devices import Device
from gputui.core.events import DeviceStep, StepReport
from gputui.train import moe
from gputui.train.models import build_model, gpt_shape
from gputui.train.paramtrace import fault
from gputui.train.optim import Updater, make_optimizer
from gputui.train.strategies import fastpath
from gputui.train.strategies.memory_rows import MemoryRows
from gputui.train.strategies.meter import Meter
from gputui.train.task import (OutputShapeError, batch_score, mean_loss, output_problem,
                               zero_score)

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def no_correct(device: torch.device) -> torch.Tensor:
    """A test score at zero, on ``device`` (what evaluate starts from): float64, which holds
    a count of correct predictions exactly and a sum of losses."""
    return zero_score(device)


def flat_layers(module: nn.Module) -> list[nn.Module]:
    """The layers of a plain Sequential, with nested plain Sequentials opened (subclasses,
    which may have their own forward, are kept whole)."""
    out: list[nn.Module] = []
    for child in module.children():
        out += flat_layers(child) if type(child) is nn.Sequential else [child]
    return out


class Strategy(MemoryRows):
    """Base class: configuration, model building, the optimizer, the loss and one micro-batched
    forward/backward pass, the update, evaluation and checkpoints (see the module doc)."""

    name = "base"
    meter: Meter  # what train_step measures (made in setup, over the devices it drives)

    def __init__(self, cfg: RunConfig, devices: list[Device], in_channels: int = 1,
                 image_size: int = 28, num_classes: int = 10, rank: int = 0,
                 world_size: int = 1, height: int = 0):
        self.cfg, self.devices = cfg, devices
        self.torch_devices = [torch.device(d.torch_device) for d in devices]
        self.in_channels, self.image_size, self.num_classes = in_channels, image_size, num_classes
        self.height = height or image_size  # image_size is the width (built-in data: square)
        self.rank, self.world_size = rank, world_size
        self.local_rank = 0  # this process's rank on its machine (multi-process: set in setup)
        n = max(len(devices), world_size)
        self.batch_size = effective_batch_size(cfg, n)
        self.lr = effective_lr(cfg, n)
        self.updater = Updater(cfg.optim, self.lr)  # schedule, clipping: optimizer_step's
        self.comm_delay_s = cfg.debug.comm_delay_s  # added to each communication (a test knob)
        self.notes: list[str] = []  # what the run says once at its start; only the strategy adds
        self.scaler: torch.amp.GradScaler | None = None  # fp16 on CUDA only (make_scaler)
        # decided once, not per step
        self.micro = cfg.optim.micro_batches
        self.amp_dtype = AMP_DTYPES.get(cfg.run.precision)
        self.task = task_of(cfg)  # "classify" (accuracy) or "lm" (loss per token)
        self.loss_name = cfg.model.loss
        self.plain_loss = self.task == "classify" and self.loss_name == "cross_entropy" \
            and not cfg.model.factory
        # a model of the user's own: its output's shape checked against the task at the first
        # loss, before the first backward (a built-in model's is right by construction)
        self.output_checked = not cfg.model.factory
        # a mixture-of-experts GPT: its MoE layers, per model a step calls (found once)
        self._moe: dict[int, list] = {}
        # CUDA graphs (compile "reduce-overhead") reuse their output memory: each step says
        # where it begins, so the previous step's outputs are not taken for live ones.
        self.graph_steps = cfg.run.compile == "reduce-overhead"

    # ---------------------------------------------------------------- building blocks
    def build_model(self) -> nn.Module:
        """The configured model on the CPU, initialised from ``run.seed``: the built-in
        model.name, or what model.factory builds (the user's code, see userfactory)."""
        m = self.cfg.model
        if m.factory:
            from gputui.train.userfactory import build_model as build_user_model

            model = build_user_model(m, self.in_channels, self.height, self.image_size,
                                     self.num_classes, seed=self.cfg.run.seed)
        else:
            shape = (gpt_shape(m, self.cfg.data.context, self.num_classes)
                     if m.name == "gpt" else None)
            model = build_model(m.name, self.in_channels, self.image_size, self.num_classes,
                                seed=self.cfg.run.seed, init=m.init, init_std=m.init_std,
                                shape=shape)
        return fastpath.to_channels_last(model) if self.cfg.run.channels_last else model

    def fast(self, module: nn.Module) -> nn.Module:
        """The module a step calls, through torch.compile when run.compile asks for it (see
        ``fastpath``); the eager module itself otherwise."""
        return fastpath.compile_module(module, self.cfg.run.compile)

    def lean(self, model: nn.Module) -> nn.Module:
        """What a step calls: a Sequential of nested plain Sequentials flattened into one that
        shares their layers (one call per layer, none per nesting level); anything else as is.
        Parameter names, checkpoints and the optimizer stay on ``model`` itself."""
        if type(model) is not nn.Sequential:
            return model
        leaves = flat_layers(model)
        return nn.Sequential(*leaves) if len(leaves) != len(model) else model

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """The configured optimizer (optim.name: sgd, adam or adamw) at the base lr."""
        return make_optimizer(self.cfg.optim, params, self.lr)

    def make_scaler(self, device: torch.device, params: list | None = None) -> None:
        """fp16 on CUDA needs a grad scaler; bf16 and fp32 do not. Torch's scaler unscales
        each device's gradients in one multi-tensor call, which refuses DTensor and plain
        gradients together (``params`` mixing them: tp's norms, fsdp x ep's experts): such a
        run ends before its first step with one line, not in its first step's traceback."""
        if self.cfg.run.precision == "fp16" and device.type == "cuda":
            from gputui.train.optim import scaler_problem

            problem = scaler_problem(params or [])
            if problem:
                raise ValueError(problem)
            self.scaler = torch.amp.GradScaler("cuda")

    def autocast(self, device: torch.device):
        """Autocast for bf16/fp16, a no-op context for fp32."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.amp_dtype)

    def scaled_loss(self, out: torch.Tensor, y: torch.Tensor, denom: float) -> torch.Tensor:
        """The mean loss (cross-entropy, or what model.loss names; per token for a language
        model, see ``gputui.train.task``) of a slice of the global batch, times the slice's share of
        it (``len(y) / denom``, the multiplication skipped when that is 1): summed over the
        slices, these give the full batch's mean loss and gradient. ``denom`` is the global
        batch (over the world size where the ranks' gradients are averaged)."""
        if self.plain_loss:  # a classifier's logits: exactly what a hand-written step does
            loss = F.cross_entropy(out if self.amp_dtype is None else out.float(), y)
        else:
            if not self.output_checked:
                problem = output_problem(out, y, self.task, self.num_classes)
                if problem:
                    raise OutputShapeError(problem)
                self.output_checked = True
            loss = mean_loss(out, y, self.loss_name)
        share = len(y) / denom
        return loss if share == 1.0 else loss * share

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, through the grad scaler when there is one."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         denom: float, device: torch.device, before_last=None) -> torch.Tensor:
        """Forward and backward of (x, y) with the loss scaled to ``len(x) / denom`` of the
        mean (``denom``: the global batch), so gradients add up to the full-batch mean; over
        ``optim.micro_batches`` slices when there are several. ``before_last`` is a context
        factory entered for all but the last micro-batch (DDP's no_sync). Returns the
        detached loss contribution. One micro-batch (the usual case) costs what a
        hand-written step does: forward, mean cross-entropy, backward."""
        if self.graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        if self.micro == 1:
            return self._pass(model, x, y, denom, device)
        k = min(self.micro, len(x))
        total: torch.Tensor | None = None
        pieces = zip(torch.tensor_split(x, k), torch.tensor_split(y, k), strict=True)
        for i, (xm, ym) in enumerate(pieces):
            last = before_last is None or i == k - 1
            ctx = contextlib.nullcontext() if last else before_last()
            with ctx:
                part = self._pass(model, xm, ym, denom, device)
            total = part if total is None else total + part
        assert total is not None  # k >= 1 slices
        return total

    def _pass(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, denom: float,
              device: torch.device) -> torch.Tensor:
        """One forward/backward of a slice (see ``scaled_loss``); the detached loss."""
        loss = self.forward_loss(model, x, y, denom, device)
        self.backward(loss)
        return loss.detach()

    def forward_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, denom: float,
                     device: torch.device) -> torch.Tensor:
        """The forward of a slice and its scaled loss (``_pass`` without the backward)."""
        if self.amp_dtype is None:
            out = model(x)
        else:
            with torch.autocast(device_type=device.type, dtype=self.amp_dtype):
                out = model(x)
        loss = self.scaled_loss(out, y, denom)
        if self.cfg.model.moe_experts:  # the routers' load-balancing loss: differentiated,
            aux = moe.aux_term(self.moe_layers(model), self.cfg.model.moe_aux_weight)
            if aux is not None:  # not reported (its value adds exactly 0)
                aux = aux / self.micro
                loss = loss + (aux - aux.detach())
        return loss

    def moe_layers(self, model: nn.Module) -> list:
        """The MoE layers of ``model`` (``gputui.train.moe``), found once per model."""
        found = self._moe.get(id(model))
        if found is None:
            found = self._moe[id(model)] = moe.layers(model)
        return found

    def moe_stats(self) -> dict[str, Any] | None:
        """The MoE layers' routing since the last call (every rank's: the layers gather the
        counts), with how the experts lie over the ranks; None for a dense model."""
        if not self.cfg.model.moe_experts:
            return None
        out = moe.read_stats(self.moe_layers(self.models()[0]))
        if out is not None:
            ep = self.cfg.parallel.ep if self.world_size > 1 else 1
            out.update(ep=ep, experts=self.cfg.model.moe_experts,
                       top_k=self.cfg.model.moe_top_k)
        return out

    def optimizer_step(self, *opts: torch.optim.Optimizer) -> None:
        """One update of each optimizer at the schedule's lr, after clipping (``updater``),
        then the grad scaler's update (when there is one). Every strategy's update is this
        call, once per optimizer step."""
        scaler = self.scaler
        self.updater.before(opts, scaler)
        fault(self.cfg.debug, self.name, self.updater.steps, opts)  # after clipping
        if scaler is None:
            for opt in opts:
                opt.step()
        else:
            for opt in opts:
                scaler.step(opt)
            scaler.update()
        self.updater.after()

    def use_eager(self) -> int:
        """Put the eager module back wherever this strategy holds a compiled one (after a
        failed compile); returns how many were replaced."""
        replaced = 0
        for name, value in list(vars(self).items()):
            value, n = fastpath.eager(value)
            if n:
                setattr(self, name, value)
                replaced += n
        return replaced

    # ---------------------------------------------------------------- what a subclass writes
    def setup(self) -> None:
        """Build models and optimizers on the devices."""
        raise NotImplementedError

    def models(self) -> list[nn.Module]:
        """The models this process trains, in checkpoint order (each replica, or the one
        model): what ``set_train`` switches, what checkpoints and memory rows hold and what
        ``evaluate`` splits a test batch over, the i-th on the i-th device."""
        raise NotImplementedError

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers, in checkpoint order (one per replica, or the one)."""
        raise NotImplementedError

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        """One optimizer step on a global batch; returns its mean loss, detached, unsynced.
        With ``data_s`` (the seconds the loop waited for this batch) the step is metered:
        ``self.meter`` keeps its marks, for ``step_report``."""
        raise NotImplementedError

    def step_report(self) -> StepReport | None:
        """The last metered step, read at the log interval (None before the first): for one
        device, its compute, update and (exposed) communication spans."""
        m = self.meter
        if not m.measured:
            return None
        step, comm = m.step_s(), m.comm.seconds()
        bd = breakdown.make(step, m.data_s, m.compute.seconds(), m.optimizer.seconds(), comm)
        row = DeviceStep(device=self.devices[0].name, samples=m.samples, compute_s=step,
                         breakdown=bd, recompute_s=(m.recompute.seconds()
                                                    if m.recompute.marks else None))
        return StepReport(step_s=step, comm_s=comm if m.comm.marks else None, devices=(row,))

    # ---------------------------------------------------------------- shared, overridable
    def data_device(self) -> torch.device:
        """Where the dataset tensors should live (the first device by default)."""
        return self.torch_devices[0]

    def compiles(self) -> bool:
        """Whether run.compile applies to this strategy (dp and fsdp say no, and why)."""
        return True

    def primary_model(self) -> nn.Module:
        """The model whose parameters stand for the run (parameter count, equivalence tests)."""
        return self.models()[0]

    def set_train(self, mode: bool) -> None:
        """Training (True) or evaluation mode for every model."""
        for model in self.models():
            model.train(mode)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The test batch's summed scores (``score``: ``[score, loss]``), split evenly over
        ``models()``, each on its device."""
        models = self.models()
        devs = self.torch_devices[:len(models)]
        correct = no_correct(devs[0])
        for model, dev, xs, ys in zip(models, devs, torch.tensor_split(x, len(models)),
                                      torch.tensor_split(y, len(models)), strict=True):
            if len(xs) == 0:
                continue
            with self.autocast(dev):
                out = model(xs.to(dev, non_blocking=True))
            correct += self.score(out, ys.to(dev, non_blocking=True)).to(devs[0])
        return correct

    def score(self, out: Any, y: torch.Tensor) -> torch.Tensor:
        """A test batch's summed scores (float64, ``[score, loss]``): correct predictions
        when classifying, the sum of the examples' mean loss per token for language modelling
        (``task``); then the sum of the examples' losses (``gputui.train.task.batch_score``)."""
        return batch_score(out, y, self.task, self.loss_name)

    def reduce_metric(self, value: torch.Tensor) -> torch.Tensor:
        """Combine a metric over processes (identity for single-process strategies)."""
        return value

    def close(self) -> None:
        """Release resources (process groups, CUDA memory)."""

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything training needs to continue exactly: every model of ``models()``, every
        optimizer and the grad scaler. Tensors and plain containers only, so a checkpoint
        loads with ``weights_only=True``. Multi-process strategies call this on every rank
        (a sharded one gathers here); rank 0 writes the file."""
        return {"models": [m.state_dict() for m in self.models()],
                "optimizers": [o.state_dict() for o in self.optimizers()],
                "scaler": self.scaler_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what ``state_dict`` returned into the set-up models and optimizers."""
        models, opts = self.models(), self.optimizers()
        if len(state["models"]) != len(models) or len(state["optimizers"]) != len(opts):
            raise ValueError(f"{len(state['models'])} model(s) and {len(state['optimizers'])} "
                             f"optimizer(s) saved, {len(models)} and {len(opts)} here")
        for model, saved in zip(models, state["models"], strict=True):
            model.load_state_dict(saved)
        for opt, saved in zip(opts, state["optimizers"], strict=True):
            opt.load_state_dict(saved)
        self.load_scaler_state(state)

    def scaler_state(self) -> dict[str, Any] | None:
        """The grad scaler's state for a checkpoint (None without one)."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's grad-scaler state, when both it and this run have one."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
