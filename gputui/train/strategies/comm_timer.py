"""How long DDP's gradient sync takes, without adding a sync point to any step.

DDP all-reduces gradients in buckets while backward is still running, so the communication
cannot be timed around a call. Instead :class:`CommTimer` is DDP's communication hook: it
runs torch's default all-reduce hook and, on metered steps only, marks each bucket's launch
and completion into the strategy's meter (``meter.comm``, see
:mod:`~gputui.train.strategies.meter`: perf_counter on CPU; CUDA events on GPU, the end
recorded in the future's callback, which runs on the communication stream, so it lands after
the all-reduce kernel). The marks are read at the log interval, where the loop synchronises
anyway.

The marks also split the step (``split``): backward's compute ends when the last bucket is
ready (its launch), so communication before that was hidden behind compute and what follows,
up to the end of backward's wait for the all-reduces, is exposed: the step waits for it.
``delay_s`` (debug.comm_delay_s) holds back each bucket's result that long, on every step: a
slower link, on purpose.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gputui.train.strategies.meter import Meter, merged


class SpanTimer:
    """What ddp and fsdp share of a communication timer: it marks the metered step's
    collectives into ``meter.comm`` (and their bytes into ``meter.comm_bytes``), says whether
    its marks split the step into compute and exposed comm, and holds each collective back
    ``delay_s`` on every step."""

    def __init__(self, meter: Meter, delay_s: float = 0.0, splits: bool = True):
        self.meter, self.delay_s = meter, delay_s
        self.splits = splits  # its marks split the step into compute and exposed comm

    def split(self) -> tuple[float, float, float] | None:
        """(end of backward compute, exposed comm, overlapped comm), seconds from the metered
        step's start; None when its marks cannot split the step."""
        raise NotImplementedError


class CommTimer(SpanTimer):
    """DDP communication hook: the default all-reduce, with marks on metered steps."""

    def __init__(self, meter: Meter, group: dist.ProcessGroup | None = None,
                 delay_s: float = 0.0):
        super().__init__(meter, delay_s)
        self.group = group

    def hook(self, state, bucket):  # no annotations: DDP checks them, and they are strings here
        """The registered hook: DDP calls it once per bucket (a ``dist.GradBucket``) whose
        gradients are ready; returns the future of the averaged bucket."""
        # allreduce_hook is typed ProcessGroup, but takes None as the default group (as
        # register_comm_hook's own docs do): the two calls below pass self.group, maybe None
        m = self.meter
        if not m.on:
            fut = default_hooks.allreduce_hook(self.group, bucket)  # type: ignore[arg-type]
            return fut.then(self._late) if self.delay_s else fut
        start = m.clock.mark()
        buffer = bucket.buffer()
        m.comm_bytes += buffer.numel() * buffer.element_size()
        fut = default_hooks.allreduce_hook(self.group, bucket)  # type: ignore[arg-type]
        if self.delay_s:
            fut = fut.then(self._late)

        def done(f: torch.futures.Future) -> torch.Tensor:
            m.collective("ddp all-reduce", start, m.clock.mark())
            return f.value()

        return fut.then(done)

    def _late(self, f: torch.futures.Future) -> torch.Tensor:
        time.sleep(self.delay_s)
        return f.value()

    def split(self) -> tuple[float, float, float] | None:
        """Compute ends at the last bucket's launch; exposed is from there to the end of
        backward (which waits for every all-reduce); overlapped is the all-reduce time before
        compute ended. None when the step synced nothing."""
        m = self.meter
        spans = m.comm.intervals(m.start)
        if not spans:
            return None
        compute_end = max(a for a, _ in spans)
        end = m.until(m.compute_end())
        hidden = merged([(a, min(b, compute_end)) for a, b in spans if a < compute_end])
        return compute_end, max(0.0, end - compute_end), hidden


def gbps(nbytes: int, seconds: float | None) -> float | None:
    """Achieved all-reduce bandwidth in GB/s (1e9 bytes/s, as bench-comm's algbw): the bytes
    all-reduced over the time some bucket was in flight; None without either."""
    if not nbytes or not seconds or seconds <= 0:
        return None
    return nbytes / seconds / 1e9
