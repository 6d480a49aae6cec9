"""Steady-state speed: the figures every table and summary prints, warm-up excluded.

A run's first steps pay one-time costs (the allocator growing, kernel selection, DDP's bucket
set-up, caches filling), so a run's mean over all its steps depends on how long it ran. The
steady state is every log window (one ``StepMetrics``: ``run.log_every`` steps, timed without
evaluation) except the warm-up: the record's first window and every window that starts within
its first ``WARMUP_STEPS`` steps. Two runs are measured the same way when both have a steady
state by this rule. ``noise`` is the relative half-width of a 95 % interval of the steady
samples/s (twice the standard error of the windows' samples/s over their mean), the
measurement's own spread. Torch-free.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

WARMUP_STEPS = 10  # the steps of each record treated as warm-up (at least its first window)
RULE = f"warm-up excluded: the first log window and the first {WARMUP_STEPS} steps"


def steady_figures(events: Iterable[Any]) -> dict[str, Any] | None:
    """{samples_per_s, step_time_s, steps, windows, warmup_steps, noise} over the steady
    windows of a record's events, or None when every window is warm-up (a run too short)."""
    prev = None
    counted = warm = 0
    samples = elapsed = 0.0
    steps = 0
    rates: list[float] = []
    first = True
    for ev in events:
        if getattr(ev, "kind", "") != "step":
            continue
        n = ev.global_step - prev if prev is not None else ev.step
        prev = ev.global_step
        if n <= 0:
            continue
        counted += n
        start = counted - n + 1
        if first or start <= WARMUP_STEPS or ev.step_time_s <= 0:
            first = False
            warm += n
            continue
        took = ev.step_time_s * n
        elapsed += took
        samples += ev.samples_per_s * took
        steps += n
        rates.append(ev.samples_per_s)
    if not steps or elapsed <= 0:
        return None
    rate = samples / elapsed
    return {"samples_per_s": rate, "step_time_s": elapsed / steps, "steps": steps,
            "windows": len(rates), "warmup_steps": warm, "noise": _noise(rates)}


def _noise(rates: list[float]) -> float | None:
    """Twice the standard error of the mean over its mean (None: one window, unknown)."""
    k = len(rates)
    if k < 2:
        return None
    mean = sum(rates) / k
    var = sum((r - mean) ** 2 for r in rates) / (k - 1)
    return 2 * math.sqrt(var / k) / mean if mean > 0 else None


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (``n`` of them)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    mid = len(vals) // 2
    median = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
    return {"median": median, "min": vals[0], "max": vals[-1], "n": len(vals)}
