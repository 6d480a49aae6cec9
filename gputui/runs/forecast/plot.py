"""The plan's memory-against-speed view as a PNG: every mesh that fits (peak GiB per rank
against tokens/s), the Pareto front joined, the device's usable memory as a line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gputui.runs.compare.export import _pyplot, _save
from gputui.runs.forecast.estimate import GIB, pareto

if TYPE_CHECKING:
    from gputui.runs.forecast.planner import Plan


def plot_pareto(plan: Plan, path: str | Path) -> Path:
    """Write the view to ``path``; returns it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in plan.rows if r.peak and r.tokens_per_s]
    for fits, colour, label in ((True, "tab:blue", "fits"), (False, "lightgrey", "does not fit")):
        pts = [r for r in rows if r.fits == fits]
        ax.scatter([r.peak / GIB for r in pts], [r.tokens_per_s for r in pts], c=colour,
                   label=label, s=18)
    front = pareto(plan.rows)
    ax.plot([r.peak / GIB for r in front], [r.tokens_per_s for r in front], "-o",
            color="tab:red", label="Pareto front")
    for r in front:
        ax.annotate(f"{r.shape.describe()}\nzero {r.shape.zero}, ac {r.shape.ac}",
                    (r.peak / GIB, r.tokens_per_s or 0), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    ax.axvline(plan.cluster.profile.usable() / GIB, color="grey", linestyle="--",
               label="usable memory")
    ax.set_xlabel("planned peak memory per rank (GiB)")
    ax.set_ylabel("planned tokens/s (all ranks)")
    ax.set_title(f"plan on {plan.cluster.describe()}")
    ax.legend(fontsize=8)
    return _save(fig, plt, Path(path))
