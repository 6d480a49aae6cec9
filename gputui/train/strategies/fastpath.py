"""The fast path: ``run.compile`` (torch.compile) and ``run.channels_last``, for every strategy.

Each strategy passes the module its step calls through ``Strategy.fast`` (so what is compiled
is exactly what a step runs: single's flattened model, scratch's replicas, the DDP- or
model inside DDP, model_parallel's stages); evaluation runs the eager modules, so it never
triggers a compile of its own. Two exceptions say so in a note and train eager: ``dp``
(DataParallel replicates its module every step, which torch.compile does not trace) and
``fsdp`` (fully_shard's hooks broke the graph: nothing was compiled on torch 2.13 / gloo).

torch.compile is lazy: the work happens at the first forward and backward. ``warm_up`` runs
that first step before training, on the first examples of the set, and then puts back every
parameter, buffer, optimizer, grad-scaler and lr-schedule state (and the RNG), so the compile
time is reported apart from step time (InitDone.compile_s) and the run's steps are exactly
those of the eager run. A failed compile says so in one line and trains eager
(run.compile_fallback = "eager") or stops the run ("fail").
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, cast

import torch
from torch import nn

from gputui.core.errors import UserError, brief, fault_line
from gputui.core.events import Event, LogLine


class CompileError(UserError, RuntimeError):
    """torch.compile failed and run.compile_fallback = "fail"; the message is one line."""


def compile_args(mode: str) -> dict:
    """torch.compile's keyword arguments for a run.compile mode other than "off"."""
    return {"mode": None if mode == "default" else mode}


def compile_module(module: nn.Module, mode: str) -> nn.Module:
    """``module`` through torch.compile in ``mode`` ("off": the module itself)."""
    if mode == "off":
        return module
    # torch.compile is typed as returning a callable; given a module it returns a module
    # (an OptimizedModule around it)
    return cast(nn.Module, torch.compile(module, **compile_args(mode)))


def to_channels_last(model: nn.Module) -> nn.Module:
    """4-D parameters and buffers (conv weights) in channels_last; the rest as it is."""
    # Module.to's typed overloads omit memory_format, which it documents and accepts
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]


def eager(value: Any) -> tuple[Any, int]:
    """``value`` with its compiled modules put back eager (a list: each item; DDP around a
    compiled model: the model inside, in place), and how many were."""
    if isinstance(value, list):
        pairs = [eager(v) for v in value]
        return [v for v, _ in pairs], sum(n for _, n in pairs)
    if isinstance(value, nn.Module) and hasattr(value, "_orig_mod"):
        return value._orig_mod, 1
    inner = getattr(value, "module", None)  # DDP around a compiled model: same parameters
    if isinstance(value, nn.Module) and inner is not None and hasattr(inner, "_orig_mod"):
        value.module = inner._orig_mod
        return value, 1
    return value, 0


def _one_line(exc: BaseException) -> str:
    return brief(fault_line(exc), 300)


def warm_up(strategy, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step on (x, y) through the compiled modules, then every state put back."""
    saved = copy.deepcopy(strategy.state_dict())
    steps = strategy.updater.steps  # the lr schedule's count: this step is not the run's
    cuda = sorted({d.index for d in strategy.devices if d.kind == "cuda"})
    try:
        with torch.random.fork_rng(devices=cuda):
            strategy.train_step(x, y)  # not metered: the run's timing starts with its steps
    finally:
        for opt in strategy.optimizers():
            opt.zero_grad(set_to_none=True)
        strategy.load_state_dict(saved)
        strategy.updater.steps = steps


def compile_ahead(strategy, ds, emit: Callable[[Event], None]) -> float:
    """Compile before the first step (see the module doc); returns the seconds it took (0.0
    when run.compile is off or does not apply). Raises CompileError on a failed compile
    with run.compile_fallback = "fail"."""
    run = strategy.cfg.run
    if run.compile == "off" or not strategy.compiles():
        return 0.0
    device = strategy.data_device()
    n = strategy.batch_size
    x = ds.train_x[:n].to(device)
    if run.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    y = ds.train_y[:n].to(device)
    t0 = time.perf_counter()
    try:
        warm_up(strategy, x, y)
    except Exception as exc:  # noqa: BLE001 - any compiler failure becomes one line
        what = f"torch.compile (mode \"{run.compile}\") failed: {_one_line(exc)}"
        if run.compile_fallback == "fail":
            raise CompileError(f"{what}; set run.compile = \"off\" or run.compile_fallback = "
                               f"\"eager\"") from None
        strategy.use_eager()
        torch.compiler.reset()
        emit(LogLine(level="warning", message=f"{what}; training eager instead "
                                              f"(run.compile_fallback = \"eager\")"))
    return time.perf_counter() - t0
