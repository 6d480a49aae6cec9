"""A plotext plot of several named curves on one pair of axes (runs compared side by side)."""

from __future__ import annotations


from gputui.tui.fmt import thin
from gputui.tui.widgets.plots import RedrawnPlot, draw_empty


class OverlayPlot(RedrawnPlot):
    """Named (x, y) series drawn together with a legend; redrawn when the series change."""

    def __init__(self, title: str, xlabel: str, *, id: str | None = None,
                 ylim: tuple[float, float] | None = None) -> None:
        super().__init__(id=id, classes="metric-plot")
        self.title, self.xlabel, self.ylim = title, xlabel, ylim
        self.series: dict[str, list[tuple[float, float]]] = {}

    def set_series(self, series: dict[str, list[tuple[float, float]]]) -> None:
        """Replace every curve and redraw."""
        self.series = {k: [(float(x), float(y)) for x, y in v] for k, v in series.items()}
        self.redraw()

    def redraw(self) -> None:
        """Rebuild the figure from the series."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        limit = max(16, 2 * max(1, self.size.width))
        drawn = 0
        for label, points in self.series.items():
            pts = thin(points, limit)
            if not pts:
                continue
            marker = "braille" if len(pts) > 3 else "dot"
            plt.plot([p[0] for p in pts], [p[1] for p in pts], label=label, marker=marker)
            drawn += 1
        if drawn and self.ylim:
            plt.ylim(*self.ylim)
        if not drawn:
            draw_empty(plt, "no data recorded")
        self.refresh()
