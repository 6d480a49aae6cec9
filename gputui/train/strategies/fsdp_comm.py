"""How long fsdp's collectives take, split out of compute (the CPU), timed on metered steps.

FSDP2 (``fully_shard``) all-gathers each unit's parameters before its forward and backward
and reduce-scatters its gradients after backward, inside its own hooks. torch lets a
``FSDPModule`` swap those two collectives for its own (``set_custom_all_gather``,
``set_custom_reduce_scatter``, torch 2.8 and later: feature-detected); :class:`FSDPCommTimer`
installs wrappers that call torch's default collectives and, on metered steps, mark when each
call starts and returns. On the CPU (gloo) every call is synchronous on the training thread
(fully_shard issues them with ``async_op=False`` there), so its span is communication the
step waits for: exposed, and compute is the backward span less it. On GPUs the calls are
only enqueued on fsdp's communication streams (marks there time them, see
:class:`~gputui.train.strategies.meter.Clock`), and which part overlaps compute is not
known: the total is reported (``seconds``), the split is not (compute keeps it).
``delay_s`` (debug.comm_delay_s) holds back each collective that long, on every step.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from gputui.train.strategies.comm_timer import SpanTimer
from gputui.train.strategies.meter import Meter


def _defaults():
    """torch's default all-gather and reduce-scatter classes (None where this torch has no
    custom-collective API)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            DefaultAllGather, DefaultReduceScatter)
    except ImportError:
        return None
    return DefaultAllGather, DefaultReduceScatter


class FSDPCommTimer(SpanTimer):
    """A metered step's all-gathers and reduce-scatters, marked into the meter as
    ``CommTimer``'s all-reduces are. No bytes: no all-reduce, so no bandwidth to set beside
    bench-comm's all-reduce peak."""

    def __init__(self, meter: Meter, delay_s: float = 0.0):
        # on the CPU the calls block the training thread: their span is exposed
        super().__init__(meter, delay_s, splits=not meter.clock.cuda)

    def timed(self, kind: str, inner, output: torch.Tensor, input_tensor: torch.Tensor, *args,
              **kwargs):
        """Run one collective of torch's (``inner``, named ``kind``), marked on metered steps."""
        m = self.meter
        start = m.clock.mark() if m.on else None
        work = inner(output, input_tensor, *args, **kwargs)
        self._late(work)
        if start is not None:
            m.collective(kind, start, m.clock.mark())
        return work

    def _late(self, work) -> None:
        if self.delay_s:
            if work is not None:
                work.wait()
            time.sleep(self.delay_s)

    def split(self) -> tuple[float, float, float] | None:
        """On the CPU every collective's span is exposed, so compute "ends" that long before
        backward does; None on GPUs (the overlap is not known) and when the step ran no
        collective."""
        m = self.meter
        if not m.comm.marks or not self.splits:
            return None
        exposed = m.comm.busy(m.start)
        return m.until(m.compute_end()) - exposed, exposed, 0.0


def install(model: nn.Module, timer: FSDPCommTimer) -> bool:
    """Give every fully_shard unit of ``model`` the timed collectives; False (nothing done)
    where this torch has no custom-collective API."""
    defaults = _defaults()
    if defaults is None:
        return False
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units or not hasattr(units[0], "set_custom_all_gather"):
        return False
    gather_cls, scatter_cls = defaults

    # the bases are the classes this torch provides, found at run time: mypy cannot check a
    # class whose base is a variable
    class TimedAllGather(gather_cls):  # type: ignore[valid-type, misc]
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            inner = super().__call__
            return timer.timed("fsdp all-gather", lambda o, i, **kw: inner(o, i, **kw),
                               output_tensor, input_tensor, group=group, async_op=async_op)

    class TimedReduceScatter(scatter_cls):  # type: ignore[valid-type, misc]
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            inner = super().__call__
            return timer.timed("fsdp reduce-scatter", lambda o, i, **kw: inner(o, i, **kw),
                               output_tensor, input_tensor, group=group, op=op,
                               async_op=async_op)

    for unit in units:
        unit.set_custom_all_gather(TimedAllGather())
        unit.set_custom_reduce_scatter(TimedReduceScatter())
    return True
