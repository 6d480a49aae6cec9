"""The run's charts: plotext plots inside Textual (textual-plotext).

Each plot keeps its own history and redraws only when :meth:`MetricPlot.redraw` is called,
once per handled batch, so a burst of step metrics costs one plot build, not thousands.
"""

from __future__ import annotations

from textual_plotext import PlotextPlot

from gputui.tui.fmt import thin

MAX_POINTS = 20_000  # history kept; what is drawn is thinned to the plot's width



def draw_empty(plt, message: str) -> None:
    """An empty plot that says why, in place of axes with nothing on them."""
    plt.text(message, 0.5, 0.5, alignment="center")
    plt.xlim(0, 1)
    plt.ylim(0, 1)
    plt.xticks([])
    plt.yticks([])

class MetricPlot(PlotextPlot):
    """A line plot of (x, y) points with a title, axis labels and an empty-state message."""

    def __init__(self, title: str, xlabel: str, ylabel: str = "", *, id: str | None = None,
                 marker: str = "braille", bars: bool = False,
                 ylim: tuple[float, float] | None = None) -> None:
        super().__init__(id=id, classes="metric-plot")
        self.title = title
        self.xlabel = xlabel
        self.ylabel = ylabel
        self.marker = marker
        self.bars = bars
        self.ylim = ylim
        self.points: list[tuple[float, float]] = []
        self._dirty = True

    def add_point(self, x: float, y: float) -> None:
        """Append one point (drawn at the next redraw)."""
        self.points.append((float(x), float(y)))
        if len(self.points) > MAX_POINTS:
            # Halve the history: the curve keeps its shape, memory stays bounded.
            self.points = self.points[::2] + ([self.points[-1]] if len(self.points) % 2 == 0
                                              else [])
        self._dirty = True

    @property
    def last_y(self) -> float | None:
        """The latest value plotted, or None."""
        return self.points[-1][1] if self.points else None

    def on_mount(self) -> None:
        super().on_mount()
        self.redraw()

    def on_resize(self) -> None:
        self._dirty = True
        self.redraw()

    def redraw(self) -> None:
        """Rebuild the plot from the history if it changed."""
        if not self._dirty:
            return
        self._dirty = False
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        if self.ylabel:
            plt.ylabel(self.ylabel)
        limit = max(16, 2 * max(1, self.size.width))
        pts = thin(self.points, limit)
        if pts:
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            if self.bars:
                plt.bar(xs, ys, width=0.4)
                plt.xticks(xs, [f"{x:g}" for x in xs])
            else:
                plt.plot(xs, ys, marker=self.marker)
            if self.ylim:
                plt.ylim(*self.ylim)
        else:
            draw_empty(plt, "waiting for data")
        self.refresh()


class LossPlot(MetricPlot):
    """Training loss at each logged step."""

    def __init__(self) -> None:
        super().__init__("Training loss", "step", id="loss-plot")


class AccuracyPlot(MetricPlot):
    """Test accuracy after each epoch; a language model's validation loss instead
    (``language_model``), beside its unigram baseline."""

    def __init__(self) -> None:
        super().__init__("Test accuracy per epoch (%)", "epoch", id="acc-plot", bars=True,
                         ylim=(0, 100))

    def language_model(self, baseline: float | None) -> None:
        """Show validation loss per epoch (nats per token), titled with the baseline."""
        base = f", unigram baseline {baseline:.2f}" if baseline is not None else ""
        self.title = f"Validation loss per epoch (nats/token{base})"
        self.ylim = None
        self._dirty = True


class ThroughputPlot(MetricPlot):
    """Samples per second at each logged step (tokens per second for a language model)."""

    def __init__(self) -> None:
        super().__init__("Samples/s", "step", id="throughput-plot")

    def language_model(self) -> None:
        self.title = "Tokens/s"
        self._dirty = True
