"""How long DDP's gradient sync takes, without adding a sync point to any step.

DDP all-reduces gradients in buckets while backward is still running, so the communication
cannot be timed around a call. Instead :class:`CommTimer` is DDP's communication hook: it
runs torch's default all-reduce hook and, on metered steps only, marks each bucket's launch
and completion with the strategy's :class:`~gputui.training.strategies.base.Stopwatch`
(perf_counter on CPU; CUDA events on GPU, the end recorded in the future's callback, which
runs on the communication stream, so it lands after the all-reduce kernel). The marks are
read at the log interval, where the loop synchronises anyway.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gputui.training.strategies.base import Stopwatch


class CommTimer:
    """DDP communication hook: the default all-reduce, with marks on metered steps."""

    def __init__(self, watch: Stopwatch, group: dist.ProcessGroup | None = None):
        self.watch, self.group = watch, group
        self.active = False  # set by the strategy on the steps the loop meters
        self.spans: list[tuple[Any, Any]] = []

    def start_step(self, metered: bool) -> None:
        """Called before each step's backward: forget the last step's marks."""
        self.active = metered
        self.spans = []

    def hook(self, state, bucket):  # no annotations: DDP checks them, and they are strings here
        """The registered hook: DDP calls it once per bucket (a ``dist.GradBucket``) whose
        gradients are ready; returns the future of the averaged bucket."""
        if not self.active:
            return default_hooks.allreduce_hook(self.group, bucket)
        start = self.watch.mark()
        fut = default_hooks.allreduce_hook(self.group, bucket)

        def done(f: torch.futures.Future) -> torch.Tensor:
            self.spans.append((start, self.watch.mark()))
            return f.value()

        return fut.then(done)

    def seconds(self, step_start: Any) -> float:
        """Seconds during which some bucket was being all-reduced (overlaps merged), measured
        from the step's start mark; 0.0 when the step synced nothing (e.g. no_sync only)."""
        spans = sorted((self.watch.seconds(step_start, a), self.watch.seconds(step_start, b))
                       for a, b in self.spans)
        total, end = 0.0, float("-inf")
        for a, b in spans:
            if b <= end:
                continue
            total += b - max(a, end)
            end = b
        return total
