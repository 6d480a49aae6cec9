"""The scaling waterfall as a PNG (``gputui compare --plots``, a sweep's export): one panel
per compared run that has one, its ideal speedup, each cause's loss as a floating bar from
where the previous left off, and the measured speedup (``gputui.runs.compare.waterfall``)."""

from __future__ import annotations

from pathlib import Path

from gputui.runs.compare.table import CompareRow
from gputui.runs.export import _label, _pyplot, _save
from gputui.runs.compare.waterfall import LABELS

COLORS = {"comm": "tab:red", "straggler": "tab:orange", "bubble": "tab:purple",
          "turns": "tab:grey", "data": "goldenrod", "host": "tab:pink",
          "contention": "tab:brown", "unexplained": "lightgrey"}


def plot_waterfall(items: list[CompareRow], path: str | Path) -> Path | None:
    """waterfall.png: every run with a waterfall, side by side (None: no run has one)."""
    runs = [it for it in items if it.waterfall is not None]
    if not runs:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    for ax, it in zip(axes[0], runs, strict=True):
        wf = it.waterfall
        assert wf is not None
        # (name, bottom, height, colour, the figure written over the bar)
        bars = [("ideal", 0.0, wf.ideal, "tab:green", f"{wf.ideal:.2f}x")]
        level = wf.ideal
        for cause, lost in wf.bars:
            if abs(lost) < 0.005 and cause != "unexplained":
                continue
            bars.append((LABELS[cause], min(level, level - lost), abs(lost),
                         COLORS[cause] if lost >= 0 else "tab:cyan", f"{-lost:+.2f}"))
            level -= lost
        bars.append(("measured", 0.0, wf.measured, "tab:blue", f"{wf.measured:.2f}x"))
        xs = range(len(bars))
        ax.bar(xs, [b[2] for b in bars], bottom=[b[1] for b in bars],
               color=[b[3] for b in bars])
        for x, (_, low, height, _, text) in zip(xs, bars, strict=True):
            ax.text(x, low + height, text, ha="center", va="bottom", fontsize="x-small")
        names = [b[0] for b in bars]
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize="small")
        ax.set(ylabel="speedup (x, vs its one-device baseline)",
               title=f"{_label(it)} vs {it.baseline[-4:]}")
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)
