"""Faults the training loop turns into one clear line: a diverged loss and running out of memory.

Divergence is found without a per-step sync point: the loop keeps the window's per-step losses
as tensors and checks them at the log interval (where it syncs anyway), reporting the first
bad step. Out of memory ends the run with the advice to lower ``optim.batch_size`` and, for
single-process strategies, the largest batch that fitted when tried by halving.
"""

from __future__ import annotations

import torch

from gputui.core.errors import UserError, first_line
from gputui.train.strategies.base import Strategy

# torch.cuda.OutOfMemoryError is the same class; older releases only had the cuda name.
OOM_ERRORS: tuple[type[BaseException], ...] = (
    getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError,)
MAX_PROBES = 8


class Diverged(UserError, RuntimeError):
    """The loss became NaN or infinite; the message starts "diverged at step N"."""


class OutOfMemory(UserError, RuntimeError):
    """A training step ran out of device memory; the message holds the advice."""


def first_bad(per_step: torch.Tensor) -> int | None:
    """Index of the first non-finite value of a CPU vector of per-step losses, or None."""
    bad = (~torch.isfinite(per_step)).nonzero()
    return int(bad[0, 0]) if len(bad) else None


def diverged_message(global_step: int, epoch: int, step: int, value: float) -> str:
    """The one line a diverged run ends with."""
    return (f"diverged at step {global_step} (epoch {epoch}, step {step}): the loss is "
            f"{value}; lower optim.lr, or set run.on_divergence = \"continue\" to keep going")


def out_of_memory(exc: BaseException, strategy: Strategy, x: torch.Tensor,
                  y: torch.Tensor) -> OutOfMemory:
    """Build the OutOfMemory error for a step that failed on the global batch (x, y)."""
    batch = len(x)
    first = first_line(exc).rstrip(".")
    where = f" ({first})" if first else ""
    fits = largest_fitting_batch(strategy, x, y)
    per_device = len(strategy.devices) if strategy.cfg.optim.scale_with_devices else 1
    if fits:
        advice = (f"the largest global batch that fitted is {fits}: lower optim.batch_size to "
                  f"{max(1, fits // per_device)} (--batch-size)")
    else:
        advice = (f"lower optim.batch_size (e.g. --batch-size "
                  f"{max(1, strategy.cfg.optim.batch_size // 2)}) or raise optim.micro_batches")
    return OutOfMemory(f"out of memory at global batch size {batch}{where}; {advice}")


def largest_fitting_batch(strategy: Strategy, x: torch.Tensor, y: torch.Tensor) -> int | None:
    """Try training steps on halved batches until one fits; None when none does or when the
    strategy spans processes (a probe on one rank would leave the others waiting in a
    collective). The run ends right after, so the probe steps' updates do not matter."""
    if strategy.world_size > 1:
        return None
    smallest = max(1, len(strategy.devices) * strategy.cfg.optim.micro_batches)
    b = len(x) // 2
    for _ in range(MAX_PROBES):
        if b < smallest:
            return None
        _release(strategy)
        try:
            strategy.train_step(x[:b], y[:b])
            return b
        except OOM_ERRORS:
            b //= 2
    return None


def _release(strategy: Strategy) -> None:
    """Drop gradients and cached blocks so a probe starts from what the model itself needs."""
    for model in strategy.models():
        model.zero_grad(set_to_none=True)
    if any(d.kind == "cuda" for d in strategy.devices) and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
