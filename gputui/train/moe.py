"""Mixture of experts for the built-in GPT: a router, ``E`` expert MLPs, a capacity, and the
two all-to-alls of expert parallelism.

Each token goes to the ``top_k`` experts its router scores highest (softmax over the experts;
the gates renormalised over the chosen ``k`` when ``k > 1``, Switch's raw probability when
``k = 1``). Its output is the gate-weighted sum of those experts' MLPs; the block adds it to
the residual, so a token an expert has no room for passes through unchanged (dropped).

**The capacity rule, one global rule**: each expert takes at most
``C = ceil(capacity_factor x N x k / E)`` assignments per forward, where ``N`` is the tokens of
that forward over every data-parallel rank together (``capacity_factor = 0``: no limit, no
drop). Assignments queue slot-major (every token's first choice before any second choice,
GShard's priority), within a slot in the global token order (data-parallel rank, then
position). Each rank learns every rank's counts per slot and expert (one small all-gather over
the data-parallel ranks, :attr:`MoE.group`), so it computes the same queue positions a single
process would for the same batch: ``ep``, ``ddp`` and ``fsdp`` drop exactly the assignments
``single`` drops on that batch (micro-batches are forwards of their own: their capacity is
their own).

**The load-balancing loss** (Switch Transformer, eq. 4): ``aux = E x sum_e f_e x P_e``, ``f_e``
the share of all assignments routed to expert ``e`` (before the capacity; counts, no
gradient), ``P_e`` the mean router probability of ``e``. Both over the global batch: ``f``
from the gathered counts, ``P`` from this rank's tokens scaled so that the data-parallel mean
of the ranks' gradients is the global loss's gradient. The strategy adds
``model.moe_aux_weight x aux`` to the loss it differentiates (``aux_term``), not to the loss it
reports.

**Expert parallelism** (:func:`shard_experts`): the experts split over the ``ep`` ranks of an
expert-parallel group (consecutive data-parallel ranks), each holding ``E / ep``. A forward
sends each kept assignment's token to the rank holding its expert (``all_to_all_single``: the
dispatch), runs the local experts on what arrived, and sends the results back (the combine);
backward runs the same two exchanges reversed. Both are named on metered steps
(``meter.collective("ep dispatch" / "ep combine")``) with their bytes.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

DISPATCH, COMBINE = "ep dispatch", "ep combine"  # the two all-to-alls' names in the meter


class Experts(nn.Module):
    """``n`` GPT MLPs (width to 4x, GELU, back) as batched weights: ``fc [n, d, 4d]``,
    ``proj [n, 4d, d]`` and their biases; a rank of an expert-parallel group holds a slice
    along the first dimension."""

    def __init__(self, n: int, width: int):
        super().__init__()
        self.fc = nn.Parameter(torch.empty(n, width, 4 * width))
        self.fc_bias = nn.Parameter(torch.zeros(n, 4 * width))
        self.proj = nn.Parameter(torch.empty(n, 4 * width, width))
        self.proj_bias = nn.Parameter(torch.zeros(n, width))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``x``: the tokens of expert 0, then of expert 1, ... (``counts`` of each)."""
        out = [torch.addmm(self.proj_bias[e], F.gelu(torch.addmm(self.fc_bias[e], chunk,
                                                                 self.fc[e])), self.proj[e])
               for e, chunk in enumerate(torch.split(x, counts))]
        return torch.cat(out) if out else x


class MoE(nn.Module):
    """The MLP of a block as a mixture of experts (see the module doc). ``group`` (the
    data-parallel ranks whose tokens share one capacity rule; None: this process alone),
    ``ep_group``/``ep_size``/``ep_first`` (this rank's expert-parallel group and where it
    starts among ``group``'s ranks) and ``meter`` are set by the parallelism functions."""

    def __init__(self, width: int, experts: int, top_k: int, capacity_factor: float):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = Experts(experts, width)
        self.group: Any = None
        self.ep_group: Any = None
        self.ep_size, self.ep_first = 1, 0
        self.meter: Any = None
        self.aux: torch.Tensor | None = None  # the last forward's load-balancing loss
        self.stats = MoEStats(experts)

    def extra_repr(self) -> str:
        return (f"experts={self.n_experts}, top_k={self.top_k}, "
                f"capacity_factor={self.capacity_factor}, ep={self.ep_size}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        tokens = x.reshape(-1, d)
        n, e_all, k = tokens.shape[0], self.n_experts, self.top_k
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        gate, expert = probs.topk(k, dim=-1)  # [n, k]
        if k > 1:
            gate = gate / gate.sum(-1, keepdim=True)
        if tokens.is_meta:  # FLOP counting: every assignment through one expert's MLP
            return self._counted(tokens, gate).view(b, t, d)
        if is_fake(tokens):  # gputui plan: shapes without values (see _planned)
            return self._planned(tokens, probs, gate, expert).view(b, t, d).to(x.dtype)
        hot = F.one_hot(expert, e_all)  # [n, k, E]
        counts = everyone(hot.sum(0), self.group)  # [G, k, E]: every rank's, per slot
        me = dist.get_rank(self.group) if self.group is not None else 0
        total = counts.sum(0)  # [k, E]
        n_all = int(total[0].sum())
        cap = capacity(self.capacity_factor, n_all, k, e_all)
        kept = kept_counts(counts, cap)  # [G, k, E]
        within = ((hot.cumsum(0) - 1) * hot).sum(-1)  # each assignment's place in its queue
        keep = within < kept[me].gather(1, expert.T).T  # [n, k]
        self._balance_loss(counts, probs, n_all)
        if self.training:
            self.stats.add(total.sum(0), kept.sum((0, 1)), counts)
        # the kept assignments, slot-major, then ordered by expert (stable)
        tok = torch.arange(n, device=x.device).repeat(k)
        flat_e, flat_keep = expert.T.reshape(-1), keep.T.reshape(-1)
        flat_gate = gate.T.reshape(-1)
        sel = flat_keep.nonzero().squeeze(1)
        order = sel[torch.argsort(flat_e[sel], stable=True)]
        tok, g = tok[order], flat_gate[order]
        mine = kept[me].sum(0)  # [E]: this rank's kept assignments per expert
        split = mine.tolist() if self.ep_size == 1 else self._splits(kept, mine)
        return self._through_experts(tokens, tok, g, split).view(b, t, d).to(x.dtype)

    def _balance_loss(self, counts: torch.Tensor, probs: torch.Tensor, n_all: int) -> None:
        """The load-balancing loss over the global batch (see the module doc), kept as
        ``aux``: ``counts`` every rank's assignments per slot and expert, [G, k, E]."""
        share = counts.sum((0, 1)).double() / max(1, n_all * self.top_k)
        mean_p = probs.sum(0) * (counts.shape[0] / max(1, n_all))
        self.aux = self.n_experts * (share.to(mean_p.dtype) * mean_p).sum()

    def _through_experts(self, tokens: torch.Tensor, tok: torch.Tensor, g: torch.Tensor,
                         split: Any) -> torch.Tensor:
        """The kept assignments (token ``tok`` with gate ``g``, ordered by expert) through
        the experts and summed back into each token's output; ``split``: the rows of each
        local expert, or with ep the exchange's sizes (:meth:`_splits`)."""
        x = tokens[tok]
        y = self.experts(x, split) if self.ep_size == 1 else self._exchange(x, *split)
        return torch.zeros_like(tokens, dtype=y.dtype).index_add_(0, tok,
                                                                  y * g[:, None].to(y.dtype))

    def _splits(self, kept: torch.Tensor, mine: torch.Tensor) -> tuple[list[int],
                                                                       list[list[int]]]:
        """Expert parallelism's split sizes, planned on the CPU (one copy, not a sync per
        element on a GPU): the rows this rank sends each ep peer, and ``arrive[s][j]``, what
        peer ``s`` sends it for its local expert ``j``."""
        p, local = self.ep_size, self.n_experts // self.ep_size
        q = (dist.get_rank(self.group) if self.group is not None else 0) - self.ep_first
        send = mine.view(p, local).sum(1).tolist()
        peers = kept[self.ep_first:self.ep_first + p].sum(1).cpu()  # [p, E]: each peer's kept
        return send, peers[:, q * local:(q + 1) * local].tolist()

    def _exchange(self, x: torch.Tensor, send: list[int],
                  arrive: list[list[int]]) -> torch.Tensor:
        """Expert parallelism: ``x`` (this rank's kept assignments, ordered by expert) to the
        ranks holding their experts (``send`` rows to each), through the local experts
        (``arrive``: see :meth:`_splits`), and back."""
        p, local = self.ep_size, self.n_experts // self.ep_size
        recv = [sum(row) for row in arrive]
        got = AllToAll.apply(x, recv, send, self.ep_group, self.meter, DISPATCH)
        # arrived source-major (peer, then expert): regroup expert-major for the experts
        flat = [c for row in arrive for c in row]
        starts = [0, *itertools.accumulate(flat)]  # where each (peer, expert) run begins
        index = torch.cat([torch.arange(starts[s * local + j], starts[s * local + j]
                                        + arrive[s][j])
                           for j in range(local) for s in range(p)] or
                          [torch.zeros(0, dtype=torch.long)]).to(x.device)
        y = self.experts(got[index], [sum(arrive[s][j] for s in range(p))
                                      for j in range(local)])
        back = torch.empty_like(y).index_copy(0, index, y)  # source-major again
        return AllToAll.apply(back, send, recv, self.ep_group, self.meter, COMBINE)

    def _planned(self, tokens: torch.Tensor, probs: torch.Tensor, gate: torch.Tensor,
                 expert: torch.Tensor) -> torch.Tensor:
        """The layer under fake tensors (``gputui plan``: shapes, no values), where the
        router's choices are unknown and the real path's data-dependent selection
        (``nonzero``, ``.tolist()`` of counts) cannot run. Planned as if every rank's
        assignments were spread evenly over the experts (each slot's ``n`` tokens, ``n / E``
        an expert), then kept by the same capacity rule (:func:`kept_counts`): with a
        capacity factor of 1 or more every assignment is kept, below 1 each expert takes its
        capacity. The same ops run on those shapes: the counts' all-gather, the
        load-balancing loss, the experts' MLPs on the kept rows and, with ep, the two
        all-to-alls of the even splits (a real router's imbalance moves rows between ep
        ranks; the plan says so)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        n, e_all, k = tokens.shape[0], self.n_experts, self.top_k
        hot = F.one_hot(expert, e_all)  # [n, k, E], as the real step makes it
        counts = everyone(hot.sum(0), self.group)  # the same all-gather (its values unknown)
        # each assignment's queue place: made and dropped, the temporary the real step holds
        ((hot.cumsum(0) - 1) * hot).sum(-1)
        ranks = counts.shape[0]
        me = dist.get_rank(self.group) if self.group is not None else 0
        n_all = n * ranks
        with unset_fake_temporarily():  # the planned counts are real, small integers
            even = torch.tensor([n // e_all + (e < n % e_all) for e in range(e_all)])
            planned = even.expand(ranks, k, e_all).contiguous()
            kept = kept_counts(planned, capacity(self.capacity_factor, n_all, k, e_all))
            mine = kept[me].sum(0)
            rows = mine.tolist()
            split = rows if self.ep_size == 1 else self._splits(kept, mine)
        self._balance_loss(counts, probs, n_all)
        m = sum(rows)
        tok = torch.arange(m, device=tokens.device) % n  # which tokens: shapes only
        return self._through_experts(tokens, tok, gate.T.reshape(-1)[:m], split)

    def _counted(self, tokens: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """On the meta device (FLOPs, not values): each token through ``top_k`` experts'
        MLPs, the compute an MoE layer does when no assignment is dropped."""
        x = tokens.repeat(self.top_k, 1)
        y = self.experts(x, [x.shape[0]] + [0] * (self.experts.fc.shape[0] - 1))
        return (y * gate.T.reshape(-1, 1)).view(self.top_k, -1, tokens.shape[1]).sum(0)


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` is a FakeTensor (shapes without storage: ``gputui plan``'s tracer)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def capacity(factor: float, tokens: int, top_k: int, experts: int) -> int:
    """The assignments one expert takes per forward: ``ceil(factor x tokens x top_k /
    experts)``; every assignment when ``factor`` is 0 (no limit)."""
    if factor <= 0:
        return tokens * top_k
    return max(1, math.ceil(factor * tokens * top_k / experts))


def kept_counts(counts: torch.Tensor, cap: int) -> torch.Tensor:
    """How many of each rank's assignments per slot and expert (``counts [G, k, E]``) fit in
    the capacity ``cap``, queued slot-major, then by rank (the global rule)."""
    total = counts.sum(0)  # [k, E]
    slot_before = torch.cumsum(total, 0) - total  # [k, E]
    rank_before = torch.cumsum(counts, 0) - counts  # [G, k, E]
    start = slot_before.unsqueeze(0) + rank_before
    return (cap - start).clamp(min=0).minimum(counts)


def everyone(mine: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's counts stacked with every other of ``group``'s (``[G, ...]``; ``[1, ...]``
    without a group)."""
    if group is None:
        return mine.unsqueeze(0)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine.contiguous(), group=group)
    return torch.stack(parts)


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with autograd: ``send[i]`` rows go to peer ``i``, ``recv[i]``
    come from it; backward sends the gradients back the same way reversed. Named on the
    meter's metered steps, with the bytes this rank sent."""

    @staticmethod
    def forward(ctx, x, recv, send, group, meter, kind):  # noqa: ANN001 - autograd's signature
        ctx.recv, ctx.send, ctx.group, ctx.meter, ctx.kind = recv, send, group, meter, kind
        return _exchange(x.contiguous(), recv, send, group, meter, kind)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        out = _exchange(grad.contiguous(), ctx.send, ctx.recv, ctx.group, ctx.meter, ctx.kind)
        return out, None, None, None, None, None


def _exchange(x: torch.Tensor, recv: list[int], send: list[int], group: Any, meter: Any,
              kind: str) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    on = meter is not None and meter.on
    start = meter.clock.mark() if on else None
    dist.all_to_all_single(out, x, recv, send, group=group)
    if on:
        meter.collective(kind, start, meter.clock.mark(),
                         nbytes=x.numel() * x.element_size())
    return out


class MoEStats:
    """What the MoE layers routed since the last read (training forwards): assignments per
    expert before the capacity and kept after it, summed over the layers and every rank, and
    each data-parallel rank's assignments per expert (``sent``)."""

    def __init__(self, experts: int):
        self.experts = experts
        self.reset()

    def reset(self) -> None:
        self.routed = torch.zeros(self.experts, dtype=torch.long)
        self.kept = torch.zeros(self.experts, dtype=torch.long)
        self.sent: torch.Tensor | None = None  # [ranks, E]: each rank's assignments per expert
        self.forwards = 0

    def add(self, routed: torch.Tensor, kept: torch.Tensor, counts: torch.Tensor) -> None:
        self.routed += routed.cpu()
        self.kept += kept.cpu()
        sent = counts.sum(1).cpu()  # [G, k, E] -> [G, E]
        self.sent = sent if self.sent is None or self.sent.shape != sent.shape \
            else self.sent + sent
        self.forwards += 1


def reduce_expert_grads(experts: list[nn.Parameter], dp: int, replicas: Any,
                        meter: Any = None) -> None:
    """ep: each expert's gradient holds the tokens of this rank's ep group; summed over the
    ranks holding the same experts (``replicas``; None: none) and divided by the ``dp``
    data-parallel groups, it is the full batch's (the average DDP takes of the other
    parameters). One flat all-reduce, named on metered steps."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in experts]
    flat = torch.cat([g.reshape(-1) for g in grads]).div_(dp)
    if replicas is not None:
        on = meter is not None and meter.on
        start = meter.clock.mark() if on else None
        dist.all_reduce(flat, group=replicas)
        if on:
            meter.collective("ep expert all-reduce", start, meter.clock.mark(),
                             nbytes=flat.numel() * flat.element_size())
    at = 0
    for p, g in zip(experts, grads, strict=True):
        p.grad = flat[at:at + g.numel()].view_as(g).to(g.dtype)
        at += g.numel()


def layers(model: nn.Module) -> list[MoE]:
    """The MoE layers of ``model``, in order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def aux_term(model_layers: list[MoE], weight: float) -> torch.Tensor | None:
    """``weight`` x the layers' load-balancing losses of their last forward (None: none)."""
    found = [m.aux for m in model_layers if m.aux is not None]
    if not found or weight == 0:
        return None
    return weight * torch.stack(found).sum()


def read_stats(model_layers: list[MoE]) -> dict[str, Any] | None:
    """The layers' routing since the last read, summed over the layers, then reset: tokens
    routed and kept per expert, dropped, and each data-parallel rank's assignments per expert
    (``sent``: the tokens per expert per rank) (None: no MoE layer or no forward)."""
    if not model_layers or not any(m.stats.forwards for m in model_layers):
        return None
    routed = torch.stack([m.stats.routed for m in model_layers]).sum(0)
    kept = torch.stack([m.stats.kept for m in model_layers]).sum(0)
    forwards = max(m.stats.forwards for m in model_layers)
    sent = [m.stats.sent for m in model_layers if m.stats.sent is not None]
    by_rank = torch.stack(sent).sum(0).tolist() if sent and all(
        t.shape == sent[0].shape for t in sent) else None
    for m in model_layers:
        m.stats.reset()
    return {"routed": routed.tolist(), "kept": kept.tolist(),
            "dropped": int(routed.sum() - kept.sum()), "forwards": forwards,
            "layers": len(model_layers), "sent": by_rank}


def shard_experts(model: nn.Module, group: Any, ep_group: Any, ep: int, ep_rank: int,
                  first: int, meter: Any = None) -> list[nn.Parameter]:
    """Expert parallelism in place: each MoE layer keeps experts ``ep_rank x E/ep`` to
    ``(ep_rank + 1) x E/ep - 1`` (slices of the whole model's, built from the same seed on
    every rank) and exchanges tokens over ``ep_group`` (``ep`` ranks, the first at ``first``
    among ``group``'s); every MoE layer's capacity rule spans ``group``. Returns the expert
    parameters (their gradients are reduced over the ranks holding the same experts only)."""
    out: list[nn.Parameter] = []
    for layer in layers(model):
        layer.group, layer.meter = group, meter
        if ep > 1:
            if layer.n_experts % ep:
                raise ValueError(f"model.moe_experts = {layer.n_experts} does not split over "
                                 f"{ep} expert-parallel ranks")
            local = layer.n_experts // ep
            for name, p in list(layer.experts.named_parameters()):
                piece = p.detach()[ep_rank * local:(ep_rank + 1) * local].clone()
                setattr(layer.experts, name, nn.Parameter(piece))
            layer.ep_group, layer.ep_size, layer.ep_first = ep_group, ep, first
        out += list(layer.experts.parameters())
    return out
