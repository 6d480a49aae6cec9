"""The run screen's layout: every panel from 160x45 up, else the charts or the devices, one
plot at a time beside the epoch table; the x axis in steps or elapsed time. Mixed into
``RunScreen``, whose reactives (``show_devices``, ``plot_index``, ``time_axis``) it watches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.widgets import Static

from gputui.tui.widgets.device_panel import DevicePanel
from gputui.tui.widgets.plots import LossPlot, MetricPlot, ThroughputPlot

FULL_SIZE = (160, 45)  # the smallest terminal that shows every panel at once


if TYPE_CHECKING:  # what the mixin is checked against; at run time RunScreen brings Screen
    from textual.screen import Screen

    _Base = Screen
else:
    _Base = object


class RunLayout(_Base):
    """What the run screen shows at its size, and the keys that switch it (mixed into
    RunScreen, which provides the reactives it watches and ``redraw_plots``)."""

    if TYPE_CHECKING:
        show_devices: bool
        plot_index: int
        time_axis: bool
        _started_ev: Any

        def redraw_plots(self) -> None: ...

    def on_resize(self) -> None:
        self._lay_out()

    @property
    def compact(self) -> bool:
        """Too small for every panel at once (under 160x45): the charts or the devices, one
        plot at a time beside the epoch table."""
        return self.app.size.width < FULL_SIZE[0] or self.app.size.height < FULL_SIZE[1]

    def _lay_out(self) -> None:
        self.set_class(self.compact, "-compact")
        self.set_class(self.show_devices, "-devices")
        plots = list(self.query(MetricPlot))
        for i, plot in enumerate(plots):
            plot.set_class(i == self.plot_index % len(plots), "-current")
        if self.compact:
            shown = plots[self.plot_index % len(plots)].title if plots else ""
            n = len(self.query(DevicePanel))
            views = (f"▸ Devices ({n})  ·  d: charts" if self.show_devices else
                     f"▸ {shown}  ·  p: next plot  ·  d: devices ({n})  ·  t: x axis")
            self.query_one("#run-views", Static).update(views)
        self.refresh_bindings()

    def watch_show_devices(self) -> None:
        if self.is_mounted:
            self._lay_out()

    def watch_plot_index(self) -> None:
        if self.is_mounted:
            self._lay_out()
            self.redraw_plots()

    def action_toggle_devices(self) -> None:
        """Compact layouts: the device panels in place of the charts, and back."""
        self.show_devices = not self.show_devices

    def action_next_plot(self) -> None:
        """Compact layouts: the next plot beside the epoch table."""
        self.plot_index = (self.plot_index + 1) % max(1, len(self.query(MetricPlot)))

    def action_time_axis(self) -> None:
        """The loss and throughput plots against elapsed time, or against steps."""
        self.time_axis = not self.time_axis

    def watch_time_axis(self, on: bool) -> None:
        t0 = self._started_ev.t if self._started_ev is not None else None
        for plot in (self.query_one(LossPlot), self.query_one(ThroughputPlot)):
            plot.set_time_axis(on, t0)
        if self.is_mounted:
            self.redraw_plots()
            self.notify("x axis: elapsed time" if on else "x axis: steps", timeout=2)

