"""What one rank of a multi-process strategy (ddp, fsdp) reports of its metered step, and
the gathering of every rank's report at the log interval.

Each rank turns its meter into a :class:`~gputui.core.steps.DeviceStep`: its samples, its
compute and whole step, the breakdown (its collectives split out of compute by the strategy's
communication timer, see ``comm_timer``), its memory and process, and the collectives it
timed. The rows travel whole over the control group (gloo, on the CPU) in one
``all_gather_object``, once per log interval; each is named from the receiving rank's side
(another machine's device gets ``@node<k>``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from gputui.core import breakdown
from gputui.core.steps import DeviceStep, StepReport
from gputui.train.strategies.comm_timer import SpanTimer, gbps
from gputui.train.strategies.meter import Meter, merged

if TYPE_CHECKING:
    from gputui.train.strategies.rank import RankStrategy


def gather(strategy: RankStrategy) -> StepReport:
    """Every rank's metered step, in rank order (a collective: call on every rank); the
    report's step and comm seconds are this rank's."""
    m, timer = strategy.meter, strategy.comm
    rows: list[Any] = [None] * strategy.world_size
    dist.all_gather_object(rows, (strategy.node, row(strategy)), group=strategy.control)
    here = strategy.node
    devices = tuple(r if node == here else replace(r, device=f"{r.device}@node{node}")
                    for node, r in rows)
    comm = m.comm.busy(m.start) if m.measured and timer is not None else None
    return StepReport(step_s=m.step_s() if m.measured else 0.0, comm_s=comm, devices=devices)


def row(strategy: RankStrategy) -> DeviceStep:
    """This rank's metered step (samples and seconds 0 before its first)."""
    m, timer = strategy.meter, strategy.comm
    out = DeviceStep(strategy.devices[strategy.local_rank].name, rank=strategy.rank,
                     pid=os.getpid(), rss=_rss(), compute_s=0.0, step_time_s=0.0)
    if strategy.cuda:
        out = replace(out, mem_alloc=torch.cuda.memory_allocated(strategy.device),
                      mem_reserved=torch.cuda.memory_reserved(strategy.device))
    if not m.measured:
        return out
    bd = split(m, timer)
    forward = own_forward(m)
    out = replace(out, recompute_s=m.recompute.seconds() if m.recompute.marks else None,
                  samples=m.samples, compute_s=m.until(m.compute_end()),
                  step_time_s=m.step_s(), breakdown=bd, forward_s=forward,
                  backward_s=None if forward is None else max(0.0, bd.compute_s - forward))
    if timer is not None and m.comm.marks:  # the collectives it timed
        comm_s = m.comm.busy(m.start)
        out = replace(out, comm_s=comm_s, comm_calls=len(m.comm.marks),
                      collectives=m.collectives(), collective_bytes=m.kind_bytes or None)
        if m.comm_bytes:  # ddp's gradient all-reduce: its bandwidth
            out = replace(out, comm_bytes=m.comm_bytes, comm_gbps=gbps(m.comm_bytes, comm_s))
    return out


def split(m: Meter, timer: SpanTimer | None) -> breakdown.Breakdown:
    """The rank's breakdown: compute up to where the timer says backward's compute ended
    (ddp: the last bucket's launch), exposed comm from there to the end of backward, the
    rest of the all-reduce time hidden. Where the timer cannot split the step (fsdp on GPUs,
    a torch without fsdp's custom collectives) comm stays in compute (None); a step that
    synced nothing has 0."""
    step, (begin, backward_end) = m.step_s(), m.compute.marks[-1]
    cut = timer.split() if timer is not None else None
    if cut is None:
        exposed = overlap = None if timer is None or not timer.splits else 0.0
        compute = m.clock.seconds(begin, backward_end)
    else:
        compute_end, exposed, overlap = cut
        compute = compute_end - m.until(begin)
    return breakdown.make(step, m.data_s, compute, m.optimizer.seconds(), exposed, overlap)


def own_forward(m: Meter) -> float | None:
    """The rank's forward passes, less the collectives that ran inside them (fsdp's
    all-gathers): its own forward work (None where no forward was marked)."""
    if not m.forward.marks:
        return None
    spans = m.forward.intervals(m.start)
    comm = m.comm.intervals(m.start)
    inside = [(max(a, c), min(b, d)) for a, b in spans for c, d in comm if min(b, d) > max(a, c)]
    return max(0.0, merged(spans) - merged(inside))


@functools.cache
def _process() -> Any:
    import psutil

    return psutil.Process()


def _rss() -> int | None:
    try:
        return int(_process().memory_info().rss)
    except Exception:  # noqa: BLE001 - a figure, not a reason to fail
        return None
