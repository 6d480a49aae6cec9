"""The loop's memory and FLOP figures: counted before training, emitted after the run's
first step (FlopsInfo, MemoryReport) and at each epoch's end (MemoryReport); the FLOP/s of a
log window. A run stopped before its first step records none of them."""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from gputui.core.config import RunConfig
from gputui.core.errors import brief, first_line
from gputui.core.events import Event, FlopsInfo, LogLine, MemoryReport
from gputui.train import flops, memory
from gputui.train.data import Dataset
from gputui.train.strategies.base import Strategy


def flops_info(cfg: RunConfig, strategy: Strategy, ds: Dataset,
               emit: Callable[[Event], None]) -> FlopsInfo | None:
    """Count one step's FLOPs and find the devices' peak (emitted by FirstStep); None on the
    ranks that record nothing, or when the model cannot be built on the meta device (said in
    one line)."""
    if strategy.local_rank != 0:
        return None
    shape = (strategy.batch_size, *ds.train_x.shape[1:])
    try:
        count = flops.count_step_flops(strategy.build_model, shape, ds.num_classes,
                                       cfg.run.channels_last, strategy.task)
    except Exception as exc:  # noqa: BLE001 - a user's model may not build on meta tensors
        emit(LogLine(level="info", message=f"FLOPs not counted (the model does not build on "
                                           f"the meta device: {brief(first_line(exc), 160)})"))
        return None
    device = strategy.data_device()
    dtype = flops.matmul_dtype(cfg.run.precision, device)
    if device.type == "cuda":
        units = max(strategy.world_size, sum(d.kind == "cuda" for d in strategy.devices))
    else:
        units = strategy.world_size  # CPU devices of one process share its threads
    peak, source = flops.device_peak(device, dtype)
    total, active = (flops.moe_params(strategy.build_model, cfg.model.moe_top_k)
                     if cfg.model.moe_experts else (0, 0))
    return FlopsInfo(flops_per_step=count, peak_flops=peak * units, dtype=dtype, units=units,
                     source=source, params_total=total, params_active=active)


def rate(info: FlopsInfo | None, steps: int, seconds: float) -> tuple[float | None,
                                                                     float | None]:
    """(achieved FLOP/s, share of the peak) of ``steps`` steps in ``seconds``."""
    if info is None or seconds <= 0 or not info.flops_per_step:
        return None, None
    achieved = info.flops_per_step * steps / seconds
    return achieved, (achieved / info.peak_flops if info.peak_flops else None)


class FirstStep:
    """Meters the run's first step (the activations autograd saves) and reports memory."""

    def __init__(self, cfg: RunConfig, strategy: Strategy, emit: Callable[[Event], None],
                 info: FlopsInfo | None):
        self.strategy, self.emit, self.info = strategy, emit, info
        # compiled graphs save their tensors inside the graph, where the hooks see other ones
        self.hooks = cfg.run.compile == "off"
        self.activations: dict[str, int] | None = None
        self.pending = True

    def context(self):
        """The first step's context (the activation meter), a no-op after it."""
        if not self.pending or not self.hooks:
            return contextlib.nullcontext()
        self.meter = memory.ActivationMeter()
        return self.meter

    def after_step(self, epoch: int) -> None:
        """After the first step: keep its activation peak and report memory (a collective)."""
        if not self.pending:
            return
        self.pending = False
        if self.info is not None:
            self.emit(self.info)
        if self.hooks:
            self.activations = dict(self.meter.peak)
            del self.meter
        self.report(epoch)

    def report(self, epoch: int) -> None:
        self.emit(MemoryReport(epoch=epoch,
                               per_device=tuple(self.strategy.memory_rows(self.activations))))

    def new_epoch(self) -> None:
        """The allocator's peak starts again."""
        memory.reset_peak(torch.device(dev) for _, dev, _, _ in self.strategy.memory_groups())
