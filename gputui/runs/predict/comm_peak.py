"""The all-reduce bandwidth peak `gputui bench-comm` measured on this machine, kept beside the
prediction's figures (``predict.cache.Cache``), so that a run's achieved all-reduce
bandwidth (``StepMetrics.comm_gbps``) can be shown as a share of it. Torch-free.

Both are algorithm bandwidths (bytes of the message over the time of the call, 1e9 bytes/s):
the peak is the highest torch.distributed figure over the sizes bench-comm measured for that
device kind, device count and backend, with the machine's state while bench-comm measured it:
a peak measured under contention gives way to any measured on a quiet machine. Only sizes of
:data:`PEAK_MIN_BYTES` or more count: a call of a few KiB takes its latency, not the link's
bandwidth (a bench-comm of calls of 64 KiB at most kept 0.05 GB/s here as the machine's peak,
and a cpu plan then priced its pipeline's sends by it: 52 ms of a 226 ms step).
"""

from __future__ import annotations

from typing import Any

from gputui.runs.predict.cache import Cache

PEAK_MIN_BYTES = 256 * 2**10  # the smallest call whose time is mostly bandwidth


def key(kind: str, n: int, backend: str) -> str:
    return f"bench-comm|{kind}|n{n}|{backend}"


def keep(result: dict[str, Any], kind: str, cache=None) -> dict | None:
    """Keep the torch rows' peak of a bench-comm result (``comm_bench.run_bench``) when it
    beats the one kept; returns what is kept for that key (None: nothing measured at
    :data:`PEAK_MIN_BYTES` or more)."""
    rows = [r for r in result.get("torch") or ()
            if r.get("algbw_gbps") and int(r.get("size", 0)) >= PEAK_MIN_BYTES]
    machine = result.get("machine") or {}
    if not rows or "error" in result:
        return None
    cache = cache or Cache()
    best = max(rows, key=lambda r: r["algbw_gbps"])
    k = key(kind, int(result["n"]), str(result.get("backend", "")))
    old = kept(kind, int(result["n"]), str(result.get("backend", "")), cache)
    new_busy = bool(machine.get("contended"))
    old_busy = bool(old and (old.get("machine") or {}).get("contended"))
    # a peak measured on a quiet machine is never replaced by one measured under contention,
    # and one measured under contention always gives way to a quiet one
    if old and not old_busy and new_busy:
        return old
    if old and old_busy == new_busy and old.get("algbw_gbps", 0) >= best["algbw_gbps"]:
        return old
    cache.put(k, {"algbw_gbps": best["algbw_gbps"], "busbw_gbps": best["busbw_gbps"],
                  "size": best["size"], "devices": result.get("devices", []),
                  "machine": machine})
    return cache.get(k)


def kept(kind: str, n: int, backend: str, cache=None) -> dict | None:
    """The kept peak (its algbw, busbw, size, devices, machine) for ``n`` devices of ``kind``
    over ``backend``, or None; one kept from calls under :data:`PEAK_MIN_BYTES` (before that
    rule) is none."""
    hit = (cache or Cache()).get(key(kind, n, backend))
    if not hit or not hit.get("algbw_gbps") or int(hit.get("size", 0)) < PEAK_MIN_BYTES:
        return None
    return hit


def peak(kind: str, n: int, backend: str, cache=None) -> float | None:
    """The kept peak algbw in GB/s for ``n`` devices of ``kind`` over ``backend``, or None."""
    hit = kept(kind, n, backend, cache)
    return float(hit["algbw_gbps"]) if hit else None


def text(gbps: float | None, peak_gbps: float | None) -> str:
    """'allreduce 0.42 GB/s, 35% of bench-comm's 1.20' (or without the peak, or 'n/a')."""
    if gbps is None:
        return "allreduce n/a"
    out = f"allreduce {gbps:.2f} GB/s"
    if not peak_gbps:
        return out
    if gbps > 1.05 * peak_gbps:  # a share above 100 % is no figure: the kept peak is not one
        return (out + f", above bench-comm's kept peak {peak_gbps:.3g} GB/s, so that peak "
                      f"was not this machine's best: `gputui bench-comm` measures it again")
    return out + f", {100 * gbps / peak_gbps:.0f}% of bench-comm's {peak_gbps:.2f}"
