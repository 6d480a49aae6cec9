"""What a pipeline step costs each stage: compute, sends, receives and the bubble.

On a metered step, the stage (:class:`TimedStage`, torch's ``PipelineStage`` with its public
per-chunk methods wrapped) marks each micro-batch's forward and backward (and the loss) as
compute, and notes every message it sends or receives (peer and bytes). Inside the
schedule's span, whatever is not compute is time the stage waits on the other stages: idle.
Part of that idle is the messages' own transfer, estimated from a ping-pong of the same size
between the two neighbours, measured once (the first time the figures are read); the rest is
the **bubble**, the wait that the schedule's fill and drain impose. With p stages of equal
cost, m micro-batches and free communication, theory says each stage idles
(p - 1) / (m + p - 1) of the span (GPipe and 1F1B alike; 1F1B saves activation memory, not
time). A weight shared across stages (a tied head) has its gradients summed inside the span:
one message each way, and its wait for the other stage's last backward is bubble.

Breakdown (``gputui.core.breakdown``): compute is the stage's compute, comm (exposed) its
sends and receives (the tied-gradient sums' included), wait is the bubble, optim the update.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from gputui.core import breakdown
from gputui.train.strategies.meter import Meter

PING_REPS = 5  # round trips of the calibration (after one to warm up)


class PipeMeter:
    """One stage's pipeline on the metered step, beside the strategy's Meter (whose compute
    span holds the micro-batches' forward, backward and loss, its optimizer span the update):
    the schedule's span (the tied-gradient sums included), the messages, and the link's
    transfer time."""

    def __init__(self, meter: Meter, stage: int, stages: int, chunks: int,
                 peers: list[int] | None = None, per_rank: int = 1, zero_bubble: bool = False):
        # stage: this rank's place in its pipeline of ``stages`` ranks, whose global ranks
        # are ``peers`` (the pipeline's order; the whole world for pp alone); ``per_rank``
        # stages on each
        self.meter, self.stage, self.stages, self.chunks = meter, stage, stages, chunks
        self.peers = peers if peers is not None else list(range(stages))
        # the bubble's share of the span with equal stages and free communication:
        # (p - 1) / (v m + p - 1); none given for the zero-bubble schedules, which fill it
        # with weight-gradient work
        self.theory = (None if zero_bubble else
                       (stages - 1) / (per_rank * chunks + stages - 1))
        self.messages: list[tuple[bool, int, int]] = []  # (sent, peer, bytes)
        self.begin: Any = None
        self.end: Any = None
        self.one_way: dict[int, float] | None = None  # peer -> seconds per message (calibrate)
        self.sizes: dict[int, int] = {}  # peer -> largest message seen (bytes)

    def start_step(self, metered: bool) -> None:
        """Before the step's first schedule: forget the last metered step's messages."""
        if metered:
            self.messages = []
            self.begin = self.meter.clock.mark()

    def note(self, ops: list, sent: bool) -> None:
        """The P2P operations a stage is about to post (their tensors' bytes, per peer)."""
        if not self.meter.on:
            return
        for op in ops:
            nbytes = op.tensor.numel() * op.tensor.element_size()
            self.messages.append((sent, op.peer, nbytes))
            self.sizes[op.peer] = max(self.sizes.get(op.peer, 0), nbytes)

    def note_tie(self, grad: torch.Tensor, first: bool) -> None:
        """A tied weight's gradient summed with the other stage holding it (first or last):
        one message each way, at the link's transfer time."""
        if not self.meter.on:
            return
        peer = self.peers[self.stages - 1 if first else 0]
        nbytes = grad.numel() * grad.element_size()
        self.messages += [(True, peer, nbytes), (False, peer, nbytes)]

    def end_pipeline(self) -> None:
        if self.meter.on:
            self.end = self.meter.clock.mark()

    def calibrate(self) -> None:
        """Once, on every rank together: each link (s, s+1) in turn times PING_REPS round
        trips of its largest message; a message's transfer is half a round trip."""
        if self.one_way is not None:
            return
        self.one_way = {}
        clock = self.meter.clock
        for s in range(self.stages - 1):
            if self.stage not in (s, s + 1):
                continue
            peer = self.peers[s + 1 if self.stage == s else s]  # its global rank
            nbytes = max(4, self.sizes.get(peer, 4))
            buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=clock.device)
            begin = None
            for i in range(PING_REPS + 1):
                if i == 1:
                    begin = clock.mark()
                if self.stage == s:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
            self.one_way[peer] = clock.seconds(begin, clock.mark()) / (2 * PING_REPS)

    def figures(self) -> dict[str, Any]:
        """This stage's metered step as ``DeviceStep`` fields: its compute, breakdown and
        pipeline figures."""
        m, clock = self.meter, self.meter.clock
        span = clock.seconds(self.begin, self.end)
        compute = m.compute.seconds()
        idle = max(0.0, span - compute)
        one_way = self.one_way or {}
        # a peer that is not a neighbour (a tied weight's other end): the links' mean
        usual = sum(one_way.values()) / len(one_way) if one_way else 0.0
        sends = sum(one_way.get(peer, usual) for sent, peer, _ in self.messages if sent)
        recvs = sum(one_way.get(peer, usual) for sent, peer, _ in self.messages if not sent)
        if sends + recvs > idle > 0:  # the estimate cannot exceed what was idle
            sends, recvs = sends * idle / (sends + recvs), recvs * idle / (sends + recvs)
        elif idle == 0:
            sends = recvs = 0.0
        bubble = max(0.0, idle - sends - recvs)  # the scaled estimate may round below 0
        bd = breakdown.make(m.step_s(), m.data_s, compute, m.optimizer.seconds(),
                            sends + recvs, 0.0, bubble)
        return {"compute_s": compute, "breakdown": bd, "comm_s": sends + recvs,
                "stage": self.stage, "pipeline_s": span, "bubble_s": bubble,
                "bubble_share": bubble / span if span > 0 else None,
                "bubble_theory": self.theory, "send_s": sends, "recv_s": recvs,
                "collectives": {**(m.collectives() or {}), "pp send": sends,
                                "pp recv": recvs},
                "p2p_bytes": sum(b for _, _, b in self.messages),
                "p2p_messages": len(self.messages)}


class TimedStage(PipelineStage):
    """torch's PipelineStage whose per-chunk compute the Meter and whose P2P posts the
    PipeMeter record (the schedules call these public methods; the overrides only mark)."""

    meter: Meter
    pipe: PipeMeter

    def forward_one_chunk(self, *args, **kwargs):
        with self.meter.compute:
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        with self.meter.compute:
            return super().backward_one_chunk(*args, **kwargs)

    def backward_weight_one_chunk(self, *args, **kwargs):
        # the zero-bubble schedules' weight gradients, apart from the input's: compute too
        with self.meter.compute:
            return super().backward_weight_one_chunk(*args, **kwargs)

    def _get_init_p2p_neighbors_ops(self):
        """torch 2.11's warm-up of the links to the neighbouring stages (2.13 warms a
        PipelineStage's by a vote through other calls and calls this only for other stage
        types): a send and a receive with each neighbour, this rank too where the neighbour
        is its own other stage (the V placements: zbv and dualpipev put stages p-1 and p on
        rank p-1), and gloo cannot send to its own rank: the rank waited until the group's
        timeout (the pp scenarios on torch 2.11: zbv hung 60 s at its first step). Those to
        this rank are left out: its own stages hand their tensors over in memory, and no
        other rank posted a match for them."""
        ops = super()._get_init_p2p_neighbors_ops()
        me = self.group_rank
        return [op for op in ops if getattr(op, "group_peer", None) != me]

    def get_fwd_recv_ops(self, *args, **kwargs):
        ops = super().get_fwd_recv_ops(*args, **kwargs)
        self.pipe.note(ops, sent=False)
        return ops

    def get_bwd_recv_ops(self, *args, **kwargs):
        ops = super().get_bwd_recv_ops(*args, **kwargs)
        self.pipe.note(ops, sent=False)
        return ops

    def get_fwd_send_ops(self, *args, **kwargs):
        ops = super().get_fwd_send_ops(*args, **kwargs)
        self.pipe.note(ops, sent=True)
        return ops

    def get_bwd_send_ops(self, *args, **kwargs):
        ops = super().get_bwd_send_ops(*args, **kwargs)
        self.pipe.note(ops, sent=True)
        return ops
