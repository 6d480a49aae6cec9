"""A sweep's table with repetitions (``--repeat N``): one row per grid cell, with the spread.

Repetition r of every point runs in the r-th pass over the grid, so each point's speedup is
paired with the baseline of its own pass (both measured back to back, under the same load):
the row shows the median speedup and its min-max over the passes, and samples/s likewise.
The trust rules (:mod:`gputui.core.trust`) use the lowest speedup of the passes as the bound the
measurements allow. A point whose baseline was measured in another session of a resumed sweep
is flagged in :func:`session_warnings`. Torch-free.
"""

from __future__ import annotations

from typing import Any

from gputui.core.steady import spread
from gputui.core.trust import flags, SWEPT

COLUMNS = ("strategy", "devices", "fast", "batch", "samples_per_s", "samples_range",
           "speedup", "speedup_range", "predicted_speedup", "efficiency", "repeats", "check")


def _range(s: dict[str, Any], form: str) -> str:
    if s["min"] is None:
        return "-"
    return f"{form.format(s['min'])}–{form.format(s['max'])} (n={s['n']})"


def grouped(items: list, points: list) -> list[dict[str, Any]]:
    """One row per grid cell: medians and ranges over the repetitions, trust flags."""
    by_run = {it.row.id: it for it in items}
    where = {p.run_id: p for p in points if p.run_id}
    cells: dict[str, list] = {}
    for p in points:
        if p.run_id in by_run:
            cells.setdefault(p.group, []).append((p, by_run[p.run_id]))
    rows = []
    for group, members in cells.items():
        first = members[0][1]
        pairs, base_row = [], None
        for p, it in members:
            base_point = where.get(it.baseline)
            if base_point is None or not it.row.samples_per_s:
                if it.speedup is not None:
                    pairs.append(it.speedup)
                continue
            same = next((q for q in points if q.group == base_point.group and q.rep == p.rep
                         and q.run_id in by_run), base_point)
            base = by_run[same.run_id].row
            base_row = base
            if base.samples_per_s:
                pairs.append(it.row.samples_per_s / base.samples_per_s)
        sps = spread([it.row.samples_per_s for _, it in members])
        sp = spread(pairs)
        n = first.row.devices or 1
        why = []
        if sp["median"] is not None:
            base = base_row or _Base(first)
            why = flags(first.row, base, sp["median"], low=sp["min"] if sp["n"] > 1 else None,
                        remedy=SWEPT)  # the passes pair each point with its own baseline
        warn = [w for _, it in members for w in it.warnings][:1]
        # a pass measured under contention or with too much noise: no conclusion
        noisy = [] if why else list(dict.fromkeys(w for _, it in members for w in it.noisy))
        shown = "flagged" if why else "noisy" if noisy else None
        rows.append({"group": group, "strategy": first.row.strategy, "devices": n,
                     "fast": first.row.fast, "batch": first.row.batch,
                     "samples_per_s": sps["median"], "samples_range": _range(sps, "{:,.0f}"),
                     "speedup": shown or sp["median"],
                     "speedup_range": _range(sp, "{:.2f}x"),
                     "predicted_speedup": first.predicted_speedup,
                     "efficiency": shown or (
                         sp["median"] / n if sp["median"] is not None else None),
                     "repeats": len(members),
                     "check": "FLAGGED" if why else "NOISY" if noisy else (
                         "below prediction" if warn else ""),
                     "flags": why, "noisy": noisy, "warnings": warn,
                     "runs": [it.row.id for _, it in members],
                     "samples_spread": sps, "speedup_spread": sp})
    return rows


class _Base:
    """A stand-in baseline when the pairs came from outside the sweep (noise unknown)."""

    def __init__(self, item):
        self.id, self.noise = item.baseline or "?", None


def session_warnings(items: list, points: list) -> None:
    """Flag points whose baseline ran in another session of a resumed sweep (in place)."""
    where = {p.run_id: p for p in points if p.run_id}
    for it in items:
        mine, base = where.get(it.row.id), where.get(it.baseline)
        if mine and base and mine.session and base.session and mine.session != base.session \
                and it.speedup is not None:
            it.flags.append(f"its baseline {it.baseline} ran in another session of this resumed "
                            f"sweep (session {base.session}, this point {mine.session}): not "
                            f"measured under the same conditions; rerun with --fresh")
