"""The one meter every strategy reports its steps through.

A strategy makes one :class:`Meter` in ``setup()`` over the devices its process drives, and
writes each ``train_step`` once, whether the step is metered or not::

    m = self.meter.begin(data_s)          # metered when the loop gave data_s
    with m.compute:                       # forward and backward on the first device
        loss = self.forward_backward(...)
    with m.comm:                          # communication (a hook may add spans instead)
        ...
    with m.optimizer:
        self.optimizer_step(self.opt)
    m.finish(samples=len(x))

On a step that is not metered a span costs one attribute test and marks nothing. A device
other than the first has its own :class:`Lane` (``m.lanes[i].compute``, ``.comm``), on its
own clock. The marks are perf_counter on the CPU and CUDA events on a GPU: recording one
does not wait for the device; they are read (``seconds``) at the log interval, where the loop
synchronises anyway. The meter keeps the last metered step until the next one begins; the
strategy's ``step_report`` turns it into a ``gputui.core.events.StepReport``.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class Clock:
    """Time marks on one device without sync points: perf_counter on the CPU, a CUDA event
    recorded on the device's current stream on a GPU (read later)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from mark ``start`` to mark ``end`` (on a GPU, waits for ``end``)."""
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start


class Span:
    """The intervals of one kind of work on one clock during the metered step: ``with span:``
    marks one (only while the meter is on); a hook that marks by itself calls ``add``."""

    def __init__(self, meter: Meter, clock: Clock):
        self.meter, self.clock = meter, clock
        self.marks: list[tuple[Any, Any]] = []
        self._open: Any = None

    def __enter__(self) -> Span:
        if self.meter.on:
            self._open = self.clock.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.meter.on:
            self.marks.append((self._open, self.clock.mark()))

    def add(self, start: Any, end: Any) -> None:
        """One interval marked elsewhere (a communication hook's launch and completion)."""
        self.marks.append((start, end))

    def seconds(self) -> float:
        """The intervals' durations, summed."""
        return sum(self.clock.seconds(a, b) for a, b in self.marks)

    def intervals(self, origin: Any) -> list[tuple[float, float]]:
        """Each interval as (start, end) seconds after mark ``origin`` of the same clock."""
        return [(self.clock.seconds(origin, a), self.clock.seconds(origin, b))
                for a, b in self.marks]

    def busy(self, origin: Any) -> float:
        """Seconds during which some interval ran (overlaps merged)."""
        return merged(self.intervals(origin))


class Lane:
    """One device's spans: its compute and its communication, on its own clock."""

    def __init__(self, meter: Meter, clock: Clock):
        self.clock = clock
        self.compute = Span(meter, clock)
        self.comm = Span(meter, clock)


class Meter:
    """A strategy's steps as it measured them: the step's start and end, its data wait and
    samples, and spans of compute, communication and the update (see the module doc).
    ``clock`` replaces the first device's (dp's marks on every GPU at once)."""

    def __init__(self, devices: list[torch.device], clock: Clock | None = None):
        self.on = False  # the step running now is metered
        self.measured = False  # some step was metered (its marks are kept until the next)
        self.lanes = [Lane(self, clock if i == 0 and clock is not None else Clock(d))
                      for i, d in enumerate(devices)]
        first = self.lanes[0]
        self.clock, self.compute, self.comm = first.clock, first.compute, first.comm
        self.optimizer = Span(self, self.clock)
        self.forward = Span(self, self.clock)  # forward passes (ranks: inside compute)
        # activation checkpointing's recomputation of the blocks' forward, inside backward
        self.recompute = Span(self, self.clock)
        self.data_s = 0.0  # the loop's wait for the metered step's batch
        self.samples = 0  # examples the metered step trained on here
        self.comm_bytes = 0  # bytes its timed collectives moved (ddp's all-reduce)
        # the collectives by name ("tp all-reduce", "fsdp all-gather", ...): each interval
        # is in ``comm`` too
        self.kinds: dict[str, Span] = {}
        self.kind_bytes: dict[str, int] = {}  # bytes sent per named collective (ep's)
        self.start: Any = None
        self.end: Any = None

    def begin(self, data_s: float | None) -> Meter:
        """A step starts; it is metered when ``data_s`` (the loop's wait for its batch) is
        given, and then the last metered step's marks are forgotten."""
        self.on = data_s is not None
        if self.on:
            for span in self.spans():
                span.marks = []
            self.kinds = {}
            self.kind_bytes = {}
            self.comm_bytes = 0
            self.data_s = data_s or 0.0
            self.start = self.clock.mark()
        return self

    def collective(self, kind: str, start: Any, end: Any, nbytes: int = 0) -> None:
        """One collective of ``kind`` ran from ``start`` to ``end`` (marks of this clock);
        ``nbytes``, where given, the bytes this rank sent in it (``kind_bytes``)."""
        self.comm.add(start, end)
        self.kinds.setdefault(kind, Span(self, self.clock)).add(start, end)
        if nbytes:
            self.kind_bytes[kind] = self.kind_bytes.get(kind, 0) + nbytes

    def collectives(self) -> dict[str, float] | None:
        """Seconds each kind of collective was in flight on the metered step (overlaps of
        one kind merged); None where none was named."""
        if not self.kinds:
            return None
        return {kind: span.busy(self.start) for kind, span in sorted(self.kinds.items())}

    def finish(self, samples: int = 0) -> None:
        """The step's update is done: its end mark (metered steps) and how many examples it
        trained on here."""
        if self.on:
            self.end = self.clock.mark()
            self.samples = samples
            self.measured = True
            self.on = False

    def spans(self) -> list[Span]:
        return [self.optimizer, self.forward, self.recompute,
                *(s for lane in self.lanes for s in (lane.compute, lane.comm))]

    def step_s(self) -> float:
        """The metered step's seconds on the first device's clock, begin to finish."""
        return self.clock.seconds(self.start, self.end)

    def until(self, mark: Any) -> float:
        """Seconds from the metered step's start to ``mark`` (first device's clock)."""
        return self.clock.seconds(self.start, mark)

    def compute_end(self) -> Any:
        """The mark where the first device's last compute span ended (the step's start when
        it has none)."""
        return self.compute.marks[-1][1] if self.compute.marks else self.start


def merged(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
