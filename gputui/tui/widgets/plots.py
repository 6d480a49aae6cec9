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

class RedrawnPlot(PlotextPlot):
    """A plot drawn whole by its :meth:`redraw`: when mounted and at every resize."""

    def on_mount(self) -> None:
        super().on_mount()
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        raise NotImplementedError


class MetricPlot(RedrawnPlot):
    """A line plot of (x, y) points with a title, axis labels and an empty-state message.

    Each point may carry the wall-clock time it was taken (``t``): with ``time_axis`` the
    plot's x axis is the run's elapsed time instead of ``xlabel``'s unit. A second series
    (``extra``, e.g. the validation loss beside the training loss) is drawn on the same axes.
    """

    def __init__(self, title: str, xlabel: str, ylabel: str = "", *, id: str | None = None,
                 marker: str = "braille", bars: bool = False,
                 ylim: tuple[float, float] | None = None, label: str = "") -> None:
        super().__init__(id=id, classes="metric-plot")
        self.title = title
        self.xlabel = xlabel
        self.ylabel = ylabel
        self.marker = marker
        self.bars = bars
        self.ylim = ylim
        self.label = label  # the main series' legend entry, shown when there is an extra
        self.points: list[tuple[float, float]] = []
        self.times: list[float | None] = []  # each point's wall-clock time, when known
        self.extra: list[tuple[float, float, float | None]] = []  # (x, y, t)
        self.extra_label = ""
        self.t0: float | None = None  # the run's start: time 0 of the time axis
        self.time_axis = False
        self._dirty = True

    def add_point(self, x: float, y: float, t: float | None = None) -> None:
        """Append one point (drawn at the next redraw)."""
        self.points.append((float(x), float(y)))
        self.times.append(t)
        if len(self.points) > MAX_POINTS:
            # Halve the history: the curve keeps its shape, memory stays bounded.
            keep = list(range(0, len(self.points), 2))
            if keep[-1] != len(self.points) - 1:
                keep.append(len(self.points) - 1)
            self.points = [self.points[i] for i in keep]
            self.times = [self.times[i] for i in keep]
        self._dirty = True

    def add_extra(self, label: str, x: float, y: float, t: float | None = None) -> None:
        """Append a point of the second series (``label`` in the legend)."""
        self.extra_label = label
        self.extra.append((float(x), float(y), t))
        self._dirty = True

    def set_time_axis(self, on: bool, t0: float | None) -> None:
        """Draw against the run's elapsed time (seconds since ``t0``) or against x."""
        if on != self.time_axis or t0 != self.t0:
            self.time_axis, self.t0 = on, t0
            self._dirty = True

    @property
    def last_y(self) -> float | None:
        """The latest value plotted, or None."""
        return self.points[-1][1] if self.points else None

    def on_resize(self) -> None:
        self._dirty = True
        super().on_resize()

    def _xy(self, points: list[tuple[float, float, float | None]]) -> list[tuple[float, float]]:
        """The points against the axis in use (time: only those that carry a time)."""
        if not self.time_axis or self.t0 is None:
            return [(x, y) for x, y, _ in points]
        return [(t - self.t0, y) for _, y, t in points if t is not None]

    def redraw(self) -> None:
        """Rebuild the plot from the history if it changed (not while hidden: a plot the
        layout gave no room would draw inverted axes)."""
        if not self._dirty or not self.display or self.size.height < 5:
            return
        self._dirty = False
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        # a title wider than the plot is dropped by plotext (a language model's, beside the
        # run screen's loss plot at 160 columns): cut to the width, marked
        room = max(8, self.size.width - 4)
        plt.title(self.title if len(self.title) <= room else self.title[:room - 1] + "…")
        timed = self.time_axis and self.t0 is not None
        plt.xlabel("time (s)" if timed else self.xlabel)
        if self.ylabel:
            plt.ylabel(self.ylabel)
        limit = max(16, 2 * max(1, self.size.width))
        main = thin(self._xy([(x, y, t) for (x, y), t in zip(self.points, self.times,
                                                             strict=True)]), limit)
        extra = thin(self._xy(self.extra), limit)
        if main:
            xs = [p[0] for p in main]
            ys = [p[1] for p in main]
            if self.bars and not timed:
                plt.bar(xs, ys, width=0.4)
                plt.xticks(xs, [f"{x:g}" for x in xs])
            else:
                plt.plot(xs, ys, marker=self.marker, label=self.label if extra else "")
            if extra:
                plt.plot([p[0] for p in extra], [p[1] for p in extra],
                         marker="dot" if len(extra) < 4 else self.marker,
                         label=self.extra_label)
            if self.ylim:
                plt.ylim(*self.ylim)
        else:
            draw_empty(plt, "waiting for data")
        self.refresh()


class LossPlot(MetricPlot):
    """Training loss at each logged step."""

    def __init__(self) -> None:
        super().__init__("Loss", "step", id="loss-plot", label="train")


class AccuracyPlot(MetricPlot):
    """Test accuracy after each epoch; a language model's validation loss instead
    (``language_model``), beside its unigram baseline."""

    def __init__(self) -> None:
        super().__init__("Test accuracy per epoch (%)", "epoch", id="acc-plot", bars=True,
                         ylim=(0, 100))

    def language_model(self, baseline: float | None) -> None:
        """Show validation loss per epoch (nats per token), titled with the baseline."""
        base = f"; unigram {baseline:.2f}" if baseline is not None else ""
        self.title = f"Val. loss per epoch (nats/token{base})"
        self.ylim = None
        self._dirty = True


class ThroughputPlot(MetricPlot):
    """Samples per second at each logged step (tokens per second for a language model)."""

    def __init__(self) -> None:
        super().__init__("Samples/s", "step", id="throughput-plot")

    def language_model(self) -> None:
        self.title = "Tokens/s"
        self._dirty = True
