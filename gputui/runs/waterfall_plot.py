"""The scaling waterfall as a PNG (``gputui compare --plots``, a sweep's export): one panel
per compared run that has one, its ideal speedup, each cause's loss as a floating bar from
where the previous left off, and the measured speedup (``gputui.runs.waterfall``)."""

from __future__ import annotations

from pathlib import Path

from gputui.runs.compare import CompareRow
from gputui.runs.export import _label, _pyplot, _save
from gputui.runs.waterfall import LABELS

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
    for ax, it in zip(axes[0], runs):
        wf = it.waterfall
        assert wf is not None
        names, lows, heights, colors = ["ideal"], [0.0], [wf.ideal], ["tab:green"]
        level = wf.ideal
        for cause, lost in wf.bars:
            if abs(lost) < 0.005 and cause != "unexplained":
                continue
            names.append(LABELS[cause])
            lows.append(min(level, level - lost))
            heights.append(abs(lost))
            colors.append(COLORS[cause] if lost >= 0 else "tab:cyan")
            level -= lost
        names.append("measured")
        lows.append(0.0)
        heights.append(wf.measured)
        colors.append("tab:blue")
        xs = range(len(names))
        ax.bar(xs, heights, bottom=lows, color=colors)
        for x, low, h, name in zip(xs, lows, heights, names):
            value = h if name in ("ideal", "measured") else None
            text = f"{value:.2f}x" if value is not None else ""
            if text:
                ax.text(x, low + h, text, ha="center", va="bottom", fontsize="small")
        for x, (_, lost) in zip(range(1, len(names) - 1),
                                [b for b in wf.bars
                                 if abs(b[1]) >= 0.005 or b[0] == "unexplained"]):
            ax.text(x, lows[x] + heights[x], f"{-lost:+.2f}", ha="center", va="bottom",
                    fontsize="x-small")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize="small")
        ax.set(ylabel="speedup (x, vs its one-device baseline)",
               title=f"{_label(it)} vs {it.baseline[-4:]}")
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)
