"""A mixture of experts' routing in words, from a StepMetrics' ``moe`` dict (torch-free: the
printer, the app and the record read it): tokens per expert and per expert-parallel rank (the
load imbalance), and the assignments the capacity dropped."""

from __future__ import annotations

from typing import Any


def per_rank(moe: dict[str, Any]) -> list[int]:
    """The assignments each expert-parallel rank's experts took (kept, within the capacity):
    experts ``r x E/ep`` to ``(r + 1) x E/ep - 1`` are rank ``r``'s of its ep group (summed
    over the ep groups, whose rank ``r``s hold the same experts)."""
    kept, ep = list(moe.get("kept") or []), max(1, int(moe.get("ep") or 1))
    size = max(1, len(kept) // ep)
    return [sum(kept[i * size:(i + 1) * size]) for i in range(ep)]


def imbalance(counts: list[int]) -> float | None:
    """max / mean of ``counts`` (1.0 = perfectly even); None without any."""
    if not counts or not sum(counts):
        return None
    return max(counts) / (sum(counts) / len(counts))


def moe_lines(moe: dict[str, Any] | None) -> list[str]:
    """Two lines: 'moe 8 experts top-2, ep 2: tokens/expert 110 162 146 94 (max/mean 1.23)'
    and 'ep rank tokens 228 222 (max/mean 1.01) · dropped 62 of 512 assignments (12.1%)';
    [] for a dense model's step."""
    if not moe or not moe.get("routed"):
        return []
    routed = [int(v) for v in moe["routed"]]
    total = sum(routed)
    dropped = int(moe.get("dropped") or 0)
    ep = int(moe.get("ep") or 1)
    spread = imbalance(routed)
    head = (f"moe {len(routed)} experts top-{moe.get('top_k', 1)}"
            + (f", ep {ep}" if ep > 1 else "") + ": tokens/expert "
            + " ".join(str(v) for v in routed)
            + (f" (max/mean {spread:.2f})" if spread is not None else ""))
    share = f" ({dropped / total:.1%})" if total else ""
    tail = f"dropped {dropped:,} of {total:,} assignments{share}"
    if ep > 1:
        ranks = per_rank(moe)
        rs = imbalance(ranks)
        tail = ("kept tokens per ep rank " + " ".join(str(v) for v in ranks)
                + (f" (max/mean {rs:.2f})" if rs is not None else "") + f" · {tail}")
    return [head, tail]


def rank_line(moe: dict[str, Any] | None, ep_rank: int) -> str | None:
    """A device panel's line for the rank ``ep_rank`` of its expert-parallel group: 'experts
    2-3: 240 tokens kept (1.05x mean)'; None for a dense model or ep = 1."""
    if not moe or int(moe.get("ep") or 1) <= 1 or not moe.get("kept"):
        return None
    ranks = per_rank(moe)
    if not 0 <= ep_rank < len(ranks):
        return None
    size = len(moe["kept"]) // len(ranks)
    mean = sum(ranks) / len(ranks)
    rel = f" ({ranks[ep_rank] / mean:.2f}x mean)" if mean else ""
    last = (ep_rank + 1) * size - 1
    which = f"{ep_rank * size}-{last}" if size > 1 else f"{last}"
    return f"experts {which}: {ranks[ep_rank]:,} tokens kept{rel}"


def active_line(flops_per_step: int, active: int, total: int) -> str:
    """What a mixture of experts' FLOPs count: 'FLOPs: 1.23 GFLOP a step over the 0.41 M
    active parameters (of 0.62 M: top-k experts a token); MFU is measured on those'."""
    return (f"FLOPs: {flops_per_step / 1e9:,.2f} GFLOP a step over the {active / 1e6:,.2f} M "
            f"active parameters (of {total / 1e6:,.2f} M: top-k experts a token); MFU is "
            f"measured on those")
