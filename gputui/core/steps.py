"""What a strategy reports of a metered step: one :class:`DeviceStep` per device (or rank)
inside one :class:`StepReport`. Frozen and torch-free: the loop puts the rows into
``StepMetrics.per_device``, and the record, the printer, compare and the app read their
fields. On disk a row is a dict of its measured fields (``DeviceStep.to_dict``); records
written before these classes existed hold the same keys, so ``from_dict`` reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from gputui.core.breakdown import Breakdown, mean, mean_value


@dataclass(frozen=True)
class DeviceStep:
    """One device's (or rank's) metered step. None: not measured there."""

    device: str  # "cuda:0", "cpu:1"; another machine's rank: "cpu:0@node1"
    samples: int = 0  # examples this device trained on in the step
    compute_s: float | None = None  # its forward and backward (rank: up to the end of backward)
    # ddp/fsdp/tp: the rank's own forward and backward (up to its last gradient), the
    # collectives inside them left out: what it did before any collective evened it out
    forward_s: float | None = None
    backward_s: float | None = None
    breakdown: Breakdown | None = None  # where its step went (gputui.core.breakdown)
    samples_per_s: float | None = None  # samples / compute_s (the loop fills it in)
    step_time_s: float | None = None  # the rank's whole step (ddp/fsdp)
    rank: int | None = None  # ddp/fsdp: the process's global rank
    pid: int | None = None  # ddp/fsdp: the rank's process
    rss: int | None = None  # ddp/fsdp: the rank's resident memory, bytes
    mem_alloc: int | None = None  # CUDA: torch's allocated bytes at the log interval
    mem_reserved: int | None = None  # CUDA: torch's reserved bytes
    comm_s: float | None = None  # the time some timed collective was in flight
    comm_calls: int | None = None  # how many collectives were timed
    comm_bytes: int | None = None  # bytes the gradient all-reduce moved (ddp)
    comm_gbps: float | None = None  # comm_bytes / comm_s, GB/s (ddp)
    # seconds each kind of collective was in flight ("ddp all-reduce", "fsdp all-gather",
    # "fsdp reduce-scatter", "tp all-reduce"; pp's "pp send" and "pp recv", estimated)
    collectives: dict | None = None
    # bytes this rank sent in each named collective that counts them (ep's "ep dispatch",
    # "ep combine", "ep expert all-reduce")
    collective_bytes: dict | None = None
    # activation checkpointing: the seconds backward spent recomputing the blocks' forward
    # (part of compute)
    recompute_s: float | None = None
    # pp: the stage's pipeline (gputui.train.strategies.pp_meter); None for other strategies
    stage: int | None = None  # its place in the pipeline, 0 = the first
    pipeline_s: float | None = None  # the schedule's span on this stage
    bubble_s: float | None = None  # idle in it waiting on the other stages, transfers excluded
    bubble_share: float | None = None  # bubble_s / pipeline_s
    bubble_theory: float | None = None  # (p - 1) / (m + p - 1): equal stages, free sends
    send_s: float | None = None  # the transfer of the messages it sent (estimated)
    recv_s: float | None = None  # ... and of those it received
    p2p_bytes: int | None = None  # bytes it sent and received
    p2p_messages: int | None = None  # messages it sent and received

    def to_dict(self) -> dict[str, Any]:
        """The record's form: the measured fields only (the breakdown as its own dict)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.to_dict() if isinstance(value, Breakdown) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceStep:
        """From the record's form, this version's or an older one (unknown keys ignored)."""
        if not isinstance(data, dict) or not isinstance(data.get("device"), str):
            raise TypeError(f"not a device's step: {data!r}")
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if isinstance(kwargs.get("breakdown"), dict):
            kwargs["breakdown"] = Breakdown.from_dict(kwargs["breakdown"])
        return cls(**kwargs)

    def with_memory(self, alloc: int | None, reserved: int | None) -> DeviceStep:
        """This row with the allocator's figures, where the strategy gave none."""
        if self.mem_alloc is not None or alloc is None:
            return self
        return replace(self, mem_alloc=alloc, mem_reserved=reserved)


@dataclass(frozen=True)
class StepReport:
    """A strategy's metered step: its seconds on the first device's clock, the seconds some
    communication ran (None: the strategy times none) and every device's row, in order."""

    step_s: float
    comm_s: float | None
    devices: tuple[DeviceStep, ...]

    def comm_share(self) -> float | None:
        """The share of the step spent communicating (None where not measured)."""
        if self.comm_s is None or not self.step_s:
            return None
        return min(1.0, self.comm_s / self.step_s)

    def breakdown(self) -> Breakdown | None:
        """The devices' breakdowns, part by part, averaged (None: none measured)."""
        return mean(d.breakdown for d in self.devices)

    def comm_gbps(self) -> float | None:
        """The mean all-reduce bandwidth over the devices that measured one."""
        return mean_value(d.comm_gbps for d in self.devices)
