"""What ``gputui verify`` compares between strategies: each step's loss and parameters, kept
by the run itself (``debug.trace_steps``: a run of that many steps), and the fault it must catch
(``debug.fault_strategy``).

The trace holds, for every training step, the loss reduced over the ranks (what the loop logs)
and the parameters after the step's update under the whole model's names (as ``single`` names
them: a rank strategy's shards and stages gathered, wrappers' prefixes dropped). It is written
by the first rank at the run's end (and on a stop) to ``<run folder>/param_trace.npz``: numpy
arrays only, so the parent reads it without torch and without pickles. Memory stays bounded:
while the model times the planned steps fits ``FULL_LIMIT`` numbers every step's parameters are
kept whole; past it, every step keeps a checksum per parameter (its sum and its sum of
squares) and only the last step's parameters are whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from gputui.core.filewrite import write_with

TRACE_NAME = "param_trace.npz"
FULL_LIMIT = 16_000_000  # numbers kept whole over the run: 64 MB of float32
FAULT_SCALE = 1.5
_PREFIXES = ("_orig_mod.", "module.")  # torch.compile's and DDP/DataParallel's wrappers


def fault(debug: Any, name: str, steps_taken: int, opts) -> None:
    """debug.fault_strategy's fault: from its global step on, every gradient of that strategy
    is ``FAULT_SCALE`` times what it should be (called after clipping, which would undo it)."""
    if debug.fault_strategy != name or steps_taken + 1 < debug.fault_step:
        return
    with torch.no_grad():
        for opt in opts:
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(FAULT_SCALE)


def plain_name(name: str) -> str:
    """A parameter's name as the bare model gives it."""
    for prefix in _PREFIXES:
        name = name.replace(prefix, "")
    return name


@torch.no_grad()
def full_params(strategy: Any) -> dict[str, torch.Tensor]:
    """Every parameter of the whole model, on the CPU in float32, by its plain name. A
    collective for sharded and staged strategies: call it on every rank."""
    full_model = getattr(strategy, "full_model", None)
    if full_model is not None:  # fsdp, pp: their own gather into a plain module
        model = full_model()
    else:
        model = strategy.primary_model()
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):  # a DTensor (tp, fsdp_tp): the whole tensor, gathered
            t = t.full_tensor()
        out[plain_name(name)] = t.to("cpu", torch.float32).clone()
    return out


class ParamTrace:
    """Each step's loss and parameters for one run (every rank holds one; rank 0 keeps)."""

    def __init__(self, strategy: Any, steps: int):
        self.strategy, self.steps = strategy, steps
        self.keeper = getattr(strategy, "rank", 0) == 0
        self.losses: list[float] = []
        self.params: list[dict[str, torch.Tensor]] = []  # whole, per step (small models)
        self.sums: list[list[tuple[float, float]]] = []  # per step, per parameter
        self.last: dict[str, torch.Tensor] = {}
        first = full_params(strategy)  # the parameters before any step: the shared init
        self.whole = sum(t.numel() for t in first.values()) * (steps + 1) <= FULL_LIMIT
        self._keep(first)

    def after_step(self, loss: torch.Tensor) -> bool:
        """After a training step (every rank): its reduced loss and the updated parameters;
        True once every step to trace is kept (the run ends there)."""
        reduced = self.strategy.reduce_metric(loss.detach().double().reshape(1))
        self.losses.append(float(reduced.item()))  # SYNC POINT (tracing only)
        self._keep(full_params(self.strategy))
        return len(self.losses) >= self.steps

    def _keep(self, params: dict[str, torch.Tensor]) -> None:
        if not self.keeper:
            return
        self.last = params
        if self.whole:
            self.params.append(params)
        else:
            self.sums.append([(t.double().sum().item(), t.double().square().sum().item())
                              for t in params.values()])

    def save(self, run_dir: str | Path) -> None:
        """Write the trace (the first rank only), atomically."""
        if not self.keeper or not self.last:
            return
        import numpy as np

        names = list(self.last)
        arrays: dict[str, Any] = {"names": np.array(names), "losses": np.array(self.losses)}
        if self.whole:
            for i, step in enumerate(self.params):
                for j, name in enumerate(names):
                    arrays[f"s{i}_p{j}"] = step[name].numpy()
        else:
            arrays["sums"] = np.array(self.sums, dtype=np.float64)
            for j, name in enumerate(names):
                arrays[f"last_p{j}"] = self.last[name].numpy()
        write_with(Path(run_dir) / TRACE_NAME, lambda fh: np.savez(fh, **arrays))
