"""Context parallelism: each sequence split over the ``cp`` ranks of a group, attention by a ring.

A long context's activations grow with its length; cp splits every sequence of the batch over
``cp`` ranks, so each rank holds ``context / cp`` of the tokens and their activations. Every
layer but attention works token by token and needs nothing from the other ranks. Attention
needs every earlier key and value; they travel (picotron's and torchtitan's ring attention):

- **The zig-zag split.** The sequence is cut into ``2 cp`` equal chunks and rank ``i`` holds
  chunks ``i`` and ``2 cp - 1 - i`` (:func:`zigzag_positions`). Under the causal mask a plain
  split would leave the last rank most of the triangle and the first almost none; with the
  zig-zag every rank does the same work at every step of the ring.
- **The ring.** Each rank keeps its queries; its keys and values (one buffer) go to the next
  rank while it computes attention with the block it holds, ``cp`` steps in all, so each
  rank meets every block once (:class:`RingAttention`). Step 0 is the rank's own block, causal;
  at a later step from a rank ``src`` below it, all its queries see the first half of the
  block (chunk ``src``); from a rank above it, only its second chunk sees the whole block. Each
  step's partial result is merged with the ones before through their log-sum-exp: the result
  is the same softmax over every key, summed in another order.
- **Backward** runs the ring again: keys and values travel as in forward, and beside them an
  accumulator of their gradients, to which every rank adds its share; one last hop brings the
  accumulator home to the block's owner. Gradients of the parameters are then the sum over the
  cp ranks of what each computed on its tokens: the cp ranks average gradients with the
  data-parallel ranks (``gputui.train.parallelize``: DDP over dp x cp, fully_shard over
  ``dp_shard_cp`` as torchtitan does), and each rank's loss is the mean over its tokens, so the
  average over the group is the whole sequence's mean.

On CUDA, PyTorch's ``torch.distributed.tensor.experimental.context_parallel`` runs instead
where the installed torch has it (:func:`torch_context_parallel`; it shards the step's inputs,
targets and positions in place with the same head-tail split and drives the GPU attention
kernels); the ring runs where it does not, and on the CPU (torch's does not run there: it
dispatches to flash, memory-efficient or cuDNN attention). The run says which ran.

Each hop is a named collective (``meter.collective("cp ring send/recv", ...)``) with its
bytes, and on the CPU the part of it the rank waited for after its attention compute was done
("cp ring wait": the rest hid behind that compute); :attr:`ContextParallel.stats` keeps the
attention compute the hops overlap and those waits.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gputui.train.strategies.meter import Meter, merged

KIND = "cp ring send/recv"  # the meter's name of a ring hop, from its start to its arrival
WAIT_KIND = "cp ring wait"  # ... and of the part a rank waited for after its attention compute
KV_TAG, GRAD_TAG = 7, 8  # the two buffers a backward hop carries at once, told apart


def zigzag_positions(context: int, cp: int, rank: int, device: Any = None) -> torch.Tensor:
    """The positions (0 .. context - 1) rank ``rank`` of ``cp`` holds: chunks ``rank`` and
    ``2 cp - 1 - rank`` of ``2 cp`` equal chunks, in order (one rank: every position)."""
    if cp == 1:
        return torch.arange(context, device=device)
    if context % (2 * cp):
        raise ValueError(f"a context of {context} does not split into {2 * cp} equal chunks")
    c = context // (2 * cp)
    first, second = rank * c, (2 * cp - 1 - rank) * c
    return torch.cat([torch.arange(first, first + c, device=device),
                      torch.arange(second, second + c, device=device)])


def split(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's zig-zag part of ``t`` along ``dim`` (a copy)."""
    return t.index_select(dim, zigzag_positions(t.shape[dim], cp, rank, t.device))


def unsplit(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole tensor from every rank's part (``parts[i]`` from rank i): split's inverse."""
    cp = len(parts)
    whole = torch.cat(parts, dim)
    order = torch.cat([zigzag_positions(whole.shape[dim], cp, r) for r in range(cp)])
    return whole.index_select(dim, torch.argsort(order).to(whole.device))


# ---------------------------------------------------------------- the ring's arithmetic
def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        n = s.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=s.device).triu_(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of queries ``q`` over one block of keys and values: the output and
    each query's log-sum-exp of its scores (what merging needs)."""
    s = _scores(q, k, scale, causal)
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def merge(out: torch.Tensor, lse: torch.Tensor, out2: torch.Tensor,
          lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attentions of the same queries over disjoint keys, as one: each weighted
    by its share of the softmax's denominator, exp(lse_i - lse)."""
    both = torch.logaddexp(lse, lse2)
    merged = (out * torch.exp(lse - both).unsqueeze(-1)
              + out2 * torch.exp(lse2 - both).unsqueeze(-1))
    return merged, both


def block_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                lse: torch.Tensor, delta: torch.Tensor, scale: float,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of attention's gradients, from the final log-sum-exp and
    ``delta = rowsum(dout * out)`` (flash attention's backward): dq, dk, dv."""
    p = torch.exp(_scores(q, k, scale, causal) - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-2, -1), dout)
    ds = p * (torch.matmul(dout, v.transpose(-2, -1)) - delta.unsqueeze(-1)) * scale
    return torch.matmul(ds, k), torch.matmul(ds.transpose(-2, -1), q), dv


@dataclass
class RingStats:
    """A metered step's ring, on this rank: the hops (seconds in flight, merged, and bytes
    sent), the attention compute between them, and the waits after that compute."""

    hops: int = 0
    bytes: int = 0
    attention_s: float = 0.0
    exposed_s: float = 0.0
    hop_marks: list[tuple[float, float]] = field(default_factory=list)

    def in_flight_s(self) -> float:
        return merged(self.hop_marks)


class _Hop:
    """One buffer sent to the next rank while the previous rank's arrives."""

    def __init__(self, ring: Ring, t: torch.Tensor, tag: int):
        self.ring, self.recv = ring, torch.empty_like(t)
        self.start = time.perf_counter()
        meter = ring.metered()
        self.start_mark = meter.clock.mark() if meter is not None else None
        self.works: list[Any]
        if t.is_cuda:  # NCCL pairs a send and a receive only in one batch
            ops = [dist.P2POp(dist.isend, t, ring.next, ring.group),
                   dist.P2POp(dist.irecv, self.recv, ring.prev, ring.group)]
            self.works = dist.batch_isend_irecv(ops)
        else:
            self.works = [dist.isend(t, ring.next, group=ring.group, tag=tag),
                          dist.irecv(self.recv, ring.prev, group=ring.group, tag=tag)]
        ring.stats.hops += 1
        ring.stats.bytes += t.numel() * t.element_size()

    def wait(self, computed_at: float) -> torch.Tensor:
        """The received buffer; ``computed_at``: when the compute this hop hid behind ended."""
        m = self.ring.metered()
        waits = m.clock.mark() if m is not None and not m.clock.cuda else None
        for work in self.works:
            work.wait()
        ring, end = self.ring, time.perf_counter()
        ring.stats.exposed_s += max(0.0, end - max(computed_at, self.start))
        ring.stats.hop_marks.append((self.start, end))
        if self.start_mark is not None and m is not None:
            done = m.clock.mark()
            m.collective(KIND, self.start_mark, done)
            if waits is not None:  # on the CPU: the part of the hop compute did not hide
                m.collective(WAIT_KIND, waits, done)
            m.comm_bytes += self.recv.numel() * self.recv.element_size()
        return self.recv


class Ring:
    """The cp ranks of one group in a ring: whom a rank sends to and receives from."""

    def __init__(self, group: Any, meter: Meter | None = None):
        self.group = group
        ranks = dist.get_process_group_ranks(group) if group is not None else \
            list(range(dist.get_world_size()))
        self.size = len(ranks)
        self.rank = ranks.index(dist.get_rank())
        self.next = ranks[(self.rank + 1) % self.size]
        self.prev = ranks[(self.rank - 1) % self.size]
        self.meter = meter
        self.stats = RingStats()

    def metered(self) -> Meter | None:
        """The meter while a metered step runs, else None."""
        return self.meter if self.meter is not None and self.meter.on else None

    def shift(self, t: torch.Tensor, tag: int) -> _Hop:
        return _Hop(self, t.contiguous(), tag)


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zig-zag queries over every rank's keys and values (see
    the module doc); q, k, v are ``batch x heads x (context / cp) x head_dim``."""

    @staticmethod
    def forward(ctx, q, k, v, ring):  # noqa: ANN001 - autograd's signature
        n, r, half = ring.size, ring.rank, q.shape[2] // 2
        scale = q.shape[-1] ** -0.5
        with _no_autocast(q):
            qf = q.float()
            kv = torch.stack([k, v])  # one buffer per hop, in the inputs' dtype
            out = lse = torch.empty(0)
            for s in range(n):
                src = (r - s) % n
                hop = ring.shift(kv, KV_TAG) if s < n - 1 else None
                t0 = time.perf_counter()
                kk, vv = kv[0].float(), kv[1].float()
                if s == 0:
                    out, lse = block_attention(qf, kk, vv, scale, causal=True)
                elif src < r:  # every query sees chunk src, none chunk 2 cp - 1 - src
                    o2, l2 = block_attention(qf, kk[..., :half, :], vv[..., :half, :], scale,
                                             causal=False)
                    out, lse = merge(out, lse, o2, l2)
                else:  # only the second chunk's queries see it, all of it
                    o2, l2 = block_attention(qf[..., half:, :], kk, vv, scale, causal=False)
                    oh, lh = merge(out[..., half:, :], lse[..., half:], o2, l2)
                    out = torch.cat([out[..., :half, :], oh], dim=2)
                    lse = torch.cat([lse[..., :half], lh], dim=2)
                t1 = time.perf_counter()
                ring.stats.attention_s += t1 - t0
                if hop is not None:
                    kv = hop.wait(t1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):  # noqa: ANN001
        q, k, v, out, lse = ctx.saved_tensors
        ring = ctx.ring
        n, r, half = ring.size, ring.rank, q.shape[2] // 2
        scale = q.shape[-1] ** -0.5
        with _no_autocast(q):
            qf, do = q.float(), dout.float()
            delta = (do * out).sum(-1)
            dq = torch.zeros_like(qf)
            kv = torch.stack([k, v])
            grad_hop: _Hop | None = None  # the accumulator of the block held next
            for s in range(n):
                src = (r - s) % n
                hop = ring.shift(kv, KV_TAG) if s < n - 1 else None
                t0 = time.perf_counter()
                kk, vv = kv[0].float(), kv[1].float()
                if s == 0:
                    gq, gk, gv = block_grads(qf, kk, vv, do, lse, delta, scale, causal=True)
                    dq += gq
                    acc = torch.stack([gk, gv])
                elif src < r:
                    gq, gk, gv = block_grads(qf, kk[..., :half, :], vv[..., :half, :], do, lse,
                                             delta, scale, causal=False)
                    dq += gq
                    acc = torch.zeros_like(kv, dtype=torch.float32)
                    acc[0, ..., :half, :] = gk
                    acc[1, ..., :half, :] = gv
                else:
                    gq, gk, gv = block_grads(qf[..., half:, :], kk, vv, do[..., half:, :],
                                             lse[..., half:], delta[..., half:], scale,
                                             causal=False)
                    dq[..., half:, :] += gq
                    acc = torch.stack([gk, gv])
                t1 = time.perf_counter()
                ring.stats.attention_s += t1 - t0
                if grad_hop is not None:  # what the ranks before added to this block's
                    acc = acc + grad_hop.wait(t1)
                grad_hop = ring.shift(acc, GRAD_TAG)  # on to the next rank (the last: home)
                if hop is not None:
                    kv = hop.wait(t1)
            assert grad_hop is not None
            dkv = grad_hop.wait(time.perf_counter())  # this rank's own block, every share
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


def _no_autocast(t: torch.Tensor):
    """The ring's arithmetic in float32 whatever autocast asks (its sums need the range)."""
    return torch.autocast(device_type=t.device.type, enabled=False)


# ---------------------------------------------------------------- torch's own, on CUDA
def torch_context_parallel() -> Any:
    """PyTorch's ``context_parallel`` context manager where this torch has it, else None
    (feature-detected: an experimental API, present in 2.11 and 2.13)."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError:
        return None
    return context_parallel


def choose(device: torch.device, available: Any = None) -> str:
    """Which attention runs: 'torch' (PyTorch's context_parallel, CUDA only, where this torch
    has it) or 'ring' (this module's, everywhere else). ``available``: the feature check's
    answer (tests hand one in; None asks :func:`torch_context_parallel`)."""
    if device.type != "cuda":
        return "ring"
    found = torch_context_parallel() if available is None else available
    return "torch" if found else "ring"


class ContextParallel:
    """One run's context parallelism, shared by the GPT's embedding and attention layers
    (``apply_cp`` sets it on them): outside :meth:`step` they run as without it (evaluation
    sees whole sequences); inside, they take this rank's zig-zag positions and the ring (or
    torch's context_parallel, ``kind``)."""

    def __init__(self, group: Any, meter: Meter | None, device: torch.device,
                 cp_mesh: Any = None, kind: str | None = None):
        self.ring = Ring(group, meter)
        self.size, self.rank = self.ring.size, self.ring.rank
        self.kind = kind or choose(device)
        self.cp_mesh = cp_mesh  # torch's context_parallel shards over it
        self._positions: torch.Tensor | None = None

    @property
    def stats(self) -> RingStats:
        return self.ring.stats

    def describe(self) -> str:
        ranks = f"{self.size} rank{'' if self.size == 1 else 's'}"
        if self.kind == "torch":
            return (f"context parallel over {ranks}: PyTorch's context_parallel "
                    f"(torch.distributed.tensor.experimental) on the GPU's attention kernels, "
                    f"head-tail split")
        return (f"context parallel over {ranks}: gputui's ring attention (zig-zag "
                f"split into {2 * self.size} chunks; keys and values sent round the ring, "
                f"partial softmax merged by log-sum-exp)")

    @contextlib.contextmanager
    def step(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple[torch.Tensor,
                                                                        torch.Tensor]]:
        """A training step's forward and backward on this rank's part of every sequence of
        ``x`` and ``y`` (batch x context): yields the parts."""
        self.ring.stats = RingStats()  # the figures of the last step
        if self.kind == "torch":
            with self._torch_step(x, y) as parts:
                yield parts
            return
        self._positions = zigzag_positions(x.shape[1], self.size, self.rank, x.device)
        try:
            yield x.index_select(1, self._positions), y.index_select(1, self._positions)
        finally:
            self._positions = None

    @contextlib.contextmanager
    def _torch_step(self, x: torch.Tensor, y: torch.Tensor):
        context_parallel = torch_context_parallel()
        xs, ys = x.clone(), y.clone()  # sharded in place
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0).contiguous()
        with context_parallel(self.cp_mesh, buffers=[xs, ys, pos], buffer_seq_dims=[1, 1, 1],
                              no_restore_buffers={xs, ys, pos}):
            self._positions = pos[0]
            try:
                yield xs, ys
            finally:
                self._positions = None

    def positions(self, idx: torch.Tensor) -> torch.Tensor:
        """The positions of ``idx``'s tokens (its own part within a step, else 0 .. len)."""
        if self._positions is not None:
            return self._positions
        return torch.arange(idx.shape[1], device=idx.device)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q, k, v (batch x heads x tokens x head_dim)."""
        if self._positions is None or self.kind == "torch" or self.size == 1:
            # outside a step, or torch's (its patched scaled_dot_product_attention)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return RingAttention.apply(q, k, v, self.ring)


def apply_cp(model: torch.nn.Module, cp: ContextParallel) -> int:
    """Give the GPT's embedding and attention layers ``cp`` (they read ``.cp``); returns how
    many attention layers take it. A model without them is a ValueError naming why."""
    from gputui.train.gpt import CausalSelfAttention, Embed

    attn = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    embeds = [m for m in model.modules() if isinstance(m, Embed)]
    if not attn or not embeds:
        raise ValueError("context parallelism splits the built-in GPT's sequences "
                         "(model.name = 'gpt'): its attention is the ring")
    for m in (*attn, *embeds):
        setattr(m, "cp", cp)  # noqa: B010 - a plain attribute, not a submodule
    return len(attn)
