"""How long DDP's gradient sync takes, without adding a sync point to any step.

DDP all-reduces gradients in buckets while backward is still running, so the communication
cannot be timed around a call. Instead :class:`CommTimer` is DDP's communication hook: it
runs torch's default all-reduce hook and, on metered steps only, marks each bucket's launch
and completion with the strategy's :class:`~gputui.train.strategies.base.Stopwatch`
(perf_counter on CPU; CUDA events on GPU, the end recorded in the future's callback, which
runs on the communication stream, so it lands after the all-reduce kernel). The marks are
read at the log interval, where the loop synchronises anyway.

The marks also split the step (``split``): backward's compute ends when the last bucket is
ready (its launch), so communication before that was hidden behind compute and what follows,
up to the end of backward's wait for the all-reduces, is exposed: the step waits for it.
``delay_s`` (debug.comm_delay_s) holds back each bucket's result that long, on every step: a
slower link, on purpose.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gputui.train.strategies.base import Stopwatch


class SpanTimer:
    """What the ddp strategy reads of a communication timer: the (start, end) marks of the
    metered step's collectives, the bytes they moved, and whether they split the step."""

    def __init__(self, watch: Stopwatch, delay_s: float = 0.0, splits: bool = True):
        self.watch, self.delay_s = watch, delay_s
        self.active = False  # set by the strategy on the steps the loop meters
        self.splits = splits  # its marks split the step into compute and exposed comm
        self.spans: list[tuple[Any, Any]] = []
        self.nbytes = 0  # bytes the metered step all-reduced (0: none, no bandwidth)

    def start_step(self, metered: bool) -> None:
        """Called before each step's forward: forget the last step's marks."""
        self.active = metered
        self.spans = []
        self.nbytes = 0

    def seconds(self, step_start: Any) -> float:
        """Seconds during which some collective ran (overlaps merged), measured from the step's
        start mark; 0.0 when the step ran none (e.g. no_sync only)."""
        return _merged([(self.watch.seconds(step_start, a), self.watch.seconds(step_start, b))
                        for a, b in self.spans])


class CommTimer(SpanTimer):
    """DDP communication hook: the default all-reduce, with marks on metered steps."""

    def __init__(self, watch: Stopwatch, group: dist.ProcessGroup | None = None,
                 delay_s: float = 0.0):
        super().__init__(watch, delay_s)
        self.group = group

    def hook(self, state, bucket):  # no annotations: DDP checks them, and they are strings here
        """The registered hook: DDP calls it once per bucket (a ``dist.GradBucket``) whose
        gradients are ready; returns the future of the averaged bucket."""
        # allreduce_hook is typed ProcessGroup, but takes None as the default group (as
        # register_comm_hook's own docs do): the two calls below pass self.group, maybe None
        if not self.active:
            fut = default_hooks.allreduce_hook(self.group, bucket)  # type: ignore[arg-type]
            return fut.then(self._late) if self.delay_s else fut
        start = self.watch.mark()
        buffer = bucket.buffer()
        self.nbytes += buffer.numel() * buffer.element_size()
        fut = default_hooks.allreduce_hook(self.group, bucket)  # type: ignore[arg-type]
        if self.delay_s:
            fut = fut.then(self._late)

        def done(f: torch.futures.Future) -> torch.Tensor:
            self.spans.append((start, self.watch.mark()))
            return f.value()

        return fut.then(done)

    def _late(self, f: torch.futures.Future) -> torch.Tensor:
        time.sleep(self.delay_s)
        return f.value()

    def split(self, step_start: Any, backward_end: Any) -> tuple[float, float, float] | None:
        """(end of backward compute, exposed comm, overlapped comm), seconds from the step's
        start: compute ends at the last bucket's launch; exposed is from there to the end of
        backward (which waits for every all-reduce); overlapped is the all-reduce time before
        compute ended. None when the step synced nothing."""
        if not self.spans:
            return None
        spans = [(self.watch.seconds(step_start, a), self.watch.seconds(step_start, b))
                 for a, b in self.spans]
        compute_end = max(a for a, _ in spans)
        end = self.watch.seconds(step_start, backward_end)
        hidden = _merged([(a, min(b, compute_end)) for a, b in spans if a < compute_end])
        return compute_end, max(0.0, end - compute_end), hidden


def gbps(nbytes: int, seconds: float | None) -> float | None:
    """Achieved all-reduce bandwidth in GB/s (1e9 bytes/s, as bench-comm's algbw): the bytes
    all-reduced over the time some bucket was in flight; None without either."""
    if not nbytes or not seconds or seconds <= 0:
        return None
    return nbytes / seconds / 1e9


def _merged(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
