"""The optimizer, the learning-rate schedule and gradient clipping that every strategy shares.

A strategy builds its optimizers with :func:`make_optimizer` and takes every update through
``Strategy.optimizer_step``, which asks an :class:`Updater` (one per strategy) for the three
things an update adds to ``opt.step()``: the lr of this step (the schedule, a pure function
of the optimizer-step count, so a resumed run takes exactly the lr an uninterrupted one
would), the clipping of the gradients to ``optim.clip_grad_norm`` (their global norm, over
every device's and every rank's shard, see :func:`clip_grad_norm`), and the count.

The defaults (sgd, constant lr, no warm-up, no clipping) leave ``opt.step()`` exactly as it
was: the lr is never written and nothing is clipped, so those runs are bit-identical to a
plain SGD loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from gputui.core.config import ConfigError
from gputui.core.config_schema import OptimSection, lr_scheduled


def make_optimizer(o: OptimSection, params: Iterable, lr: float) -> torch.optim.Optimizer:
    """``optim.name`` over ``params`` at ``lr`` (the effective lr, after scale_with_devices)."""
    kind, args = optimizer_class(o, lr)
    return build(kind, args, params)


def build(kind: type[torch.optim.Optimizer], args: dict[str, Any],
          params: Iterable) -> torch.optim.Optimizer:
    """``kind(params, **args)``, its one update loop over all of them kept where torch's
    multi-tensor (foreach) kernels cannot take them: a list mixing DTensors and plain tensors
    (tp leaves the norms plain, pp x tp too, fsdp x ep keeps the experts out of fully_shard).
    torch takes foreach by default on CUDA, and its first step there failed with "got mixed
    torch.Tensor and DTensor" (what a CPU run does when given foreach=True). The per-tensor
    loop is what CPU runs take by default: the same update."""
    params = list(params)
    if "foreach" not in args and mixes_dtensors(params):
        args = dict(args, foreach=False)
    return kind(params, **args)


def scaler_problem(params: list[Any]) -> str:
    """Why fp16's grad scaler cannot take these parameters' gradients ("" when it can)."""
    if mixes_dtensors(params):
        return ("run.precision = 'fp16': torch's grad scaler cannot unscale this mesh's "
                "gradients (DTensor and plain tensors together); use run.precision = 'bf16'")
    return ""


def mixes_dtensors(params: list[Any]) -> bool:
    """Whether ``params`` (tensors or param-group dicts) hold DTensors and plain tensors."""
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    kinds = {hasattr(p, "device_mesh") for p in tensors}
    return len(kinds) > 1


def optimizer_class(o: OptimSection, lr: float) -> tuple[type[torch.optim.Optimizer],
                                                          dict[str, Any]]:
    """The optimizer class ``optim.name`` names and its arguments at ``lr`` (what
    make_optimizer builds; ZeRO-1's sharded optimizer builds the same over its partition)."""
    if o.name == "sgd":
        return torch.optim.SGD, {"lr": lr, "momentum": o.momentum,
                                 "weight_decay": o.weight_decay}
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[o.name]
    return kind, {"lr": lr, "betas": (float(o.betas[0]), float(o.betas[1])), "eps": o.eps,
                  "weight_decay": o.weight_decay}


def lr_factor(o: OptimSection, step: int, total: int) -> float:
    """The multiple of ``optim.lr`` that optimizer step ``step`` (0-based) takes in a run of
    ``total`` optimizer steps (0: not known, so no decay): a linear warm-up reaching 1 at
    step ``warmup_steps - 1``, then the schedule over the remaining steps."""
    w = o.warmup_steps
    if step < w:
        return (step + 1) / w
    after = step - w
    if o.schedule == "step":
        return o.gamma ** (after // o.step_size)
    if o.schedule == "constant" or total <= w:
        return 1.0
    progress = min(1.0, after / (total - w))
    floor = o.min_lr_ratio
    if o.schedule == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * (1.0 - progress)  # linear


class Updater:
    """A strategy's schedule and clipping, and the count of optimizer steps taken (the
    run's global step): ``before(opts, scaler)`` just before the optimizer steps,
    ``after()`` once they did."""

    def __init__(self, o: OptimSection, base_lr: float):
        self.o, self.base_lr = o, base_lr
        self.varies = lr_scheduled(o)
        self.steps = 0  # optimizer steps taken; the next one is step number `steps`
        self.total = 0  # the run's optimizer steps (plan), 0 = not known: no decay
        # pp's stages hold different parameters: it adds the other stages' squared norms
        self.reduce_sq: Callable[[torch.Tensor], torch.Tensor] | None = None

    def plan(self, total: int, done: int = 0) -> None:
        """The run's optimizer steps (``total``) and those already taken (``done``, on a
        resume). Raises ConfigError when the warm-up would not end within the run."""
        if self.o.warmup_steps and self.o.warmup_steps >= total:
            raise ConfigError(f"optim.warmup_steps ({self.o.warmup_steps}) is not shorter than "
                              f"the run ({total} optimizer steps); lower it or train longer")
        self.total, self.steps = total, done

    def lr_at(self, step: int) -> float:
        """The lr of optimizer step ``step`` (0-based)."""
        if not self.varies:
            return self.base_lr
        return self.base_lr * lr_factor(self.o, step, self.total)

    def last_lr(self) -> float:
        """The lr of the last step taken (of the first, before any)."""
        return self.lr_at(max(0, self.steps - 1))

    def before(self, opts: tuple[torch.optim.Optimizer, ...],
               scaler: torch.amp.GradScaler | None) -> None:
        """Set this step's lr and clip the gradients (unscaled first, under a grad scaler)."""
        if self.varies:
            lr = self.lr_at(self.steps)
            for opt in opts:
                for group in opt.param_groups:
                    group["lr"] = lr
        if self.o.clip_grad_norm > 0:
            for opt in opts:
                if scaler is not None:
                    scaler.unscale_(opt)
                # each optimizer on its own: scratch's replicas hold the same gradients, and
                # every other strategy has one optimizer per process
                clip_grad_norm(_params(opt), self.o.clip_grad_norm, self.reduce_sq)

    def after(self) -> None:
        """Count the step taken."""
        self.steps += 1

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the optimizer steps taken."""
        return {"steps": self.steps}


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float,
                   reduce_sq: Callable[[torch.Tensor], torch.Tensor] | None = None
                   ) -> torch.Tensor:
    """Scale the gradients of ``params`` in place so their global L2 norm is at most
    ``max_norm``; returns the norm before clipping. Gradients may lie on several devices
    (model_parallel) or be DTensor shards (fsdp, tp): a sharded norm is made whole with
    ``full_tensor()``, an all-reduce over the mesh, so every rank clips by the same norm;
    plain gradients beside DTensor ones (a layer tp leaves whole, the same on every rank) add
    their own norm once. ``reduce_sq``, for strategies whose ranks hold different parameters
    outside any mesh (pp's stages), sums the squared norm over those ranks."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    utils = torch.nn.utils
    if not hasattr(utils, "get_total_norm"):  # torch < 2.6: the one-call form
        return utils.clip_grad_norm_(params, max_norm)
    groups = _by_layout(params)
    norms = [_whole(utils.get_total_norm([p.grad for p in g if p.grad is not None], 2.0))
             for g in groups]
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(
        torch.stack([n.to(norms[0].device) for n in norms]))
    if reduce_sq is not None:
        total = reduce_sq(total.pow(2)).sqrt()
    for group in groups:
        utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def _by_layout(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The parameters grouped by their gradient's layout: plain tensors together, DTensors by
    mesh and placements (torch's foreach kernels take one kind at a time, and fsdp_tp's grads
    lie on two meshes: the blocks' (dp, tp), the embeddings' dp alone)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        mesh = getattr(p.grad, "device_mesh", None)
        key = None if mesh is None else (mesh, tuple(getattr(p.grad, "placements", ())))
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def _whole(norm: torch.Tensor) -> torch.Tensor:
    """A norm of DTensor shards made whole (an all-reduce over the mesh); a plain one as is."""
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm
