"""One panel per training device: utilization and memory bars, their history, temp and power,
and where the device's last metered step went (a stacked bar with its legend)."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from gputui.core import breakdown
from gputui.core.breakdown import Breakdown
from gputui.core.events import DeviceSample, MemoryRow
from gputui.tui.fmt import bar_text, fmt_bytes, fmt_opt
from gputui.tui.widgets.history_row import HistoryRow
from gputui.tui.widgets.hw_figures import TrainMemory, show_mfu

HISTORY = 120  # samples kept per device for the sparklines


class Meter(Widget):
    """A one-line bar: a label, a bar as wide as the widget allows, and a value text.

    ``fraction`` None draws an empty track (a reading the device does not report). The
    ``-high`` class is set above 90 % so the stylesheet can colour a saturated bar.
    """

    COMPONENT_CLASSES = {"meter--label", "meter--bar", "meter--track"}
    fraction: reactive[float | None] = reactive(None)
    value_text: reactive[str] = reactive("n/a")

    def __init__(self, label: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.label = label

    def watch_fraction(self, fraction: float | None) -> None:
        self.set_class(fraction is not None and fraction >= 0.9, "-high")

    def render(self) -> Text:
        label = f"{self.label:<5}"
        width = max(4, self.size.width - len(label) - len(self.value_text) - 2)
        bar = bar_text(self.fraction, width)
        style = "meter--bar" if self.fraction is not None else "meter--track"
        return Text.assemble(
            (label, self.get_component_rich_style("meter--label", partial=True)), " ",
            (bar, self.get_component_rich_style(style, partial=True)), " ", self.value_text)


class StepBreakdown(Widget):
    """The device's last metered step as a stacked bar (compute, exposed comm, optimizer,
    data, wait, host: ``gputui.core.breakdown``) under its length, with a legend of the shares."""

    DEFAULT_CSS = "StepBreakdown { height: auto; }"
    parts: reactive[Breakdown | None] = reactive(None, layout=True)
    measured: reactive[bool] = reactive(True, layout=True)  # False: a device with no figures
    comm: reactive[str] = reactive("", layout=True)  # the rank's all-reduce bandwidth line

    def render(self) -> Text:
        width = max(10, self.size.width)
        bd = self.parts
        if not self.measured:
            return Text("step: not measured on this device", style="dim")
        if not bd or not bd.step_s:
            return Text("step: at the first logged step", style="dim")
        label = f"step {bd.step_s * 1000:.1f} ms "
        out = Text(label)
        for text, style in breakdown.bar(bd, width - len(label)):
            out.append(text, style=style)
        line_len = 0
        out.append("\n")
        for word, style in legend(bd):
            if line_len and line_len + 1 + len(word) > width:
                out.append("\n")
                line_len = 0
            elif line_len:
                out.append(" ")
                line_len += 1
            out.append(word, style=style)
            line_len += len(word)
        if self.comm:
            out.append("\n" + self.comm, style=breakdown.STYLES["comm_exposed_s"])
        return out


def legend(bd: Breakdown) -> list[tuple[str, str]]:
    """('compute 71%', style) words for the measured parts (under 0.5 % left out, but comm
    always where measured, as ``breakdown.line`` does; hidden communication after it, dim)."""
    step, out = bd.step_s, []
    for key in breakdown.PARTS:
        value = bd.part(key)
        if value is None or (100.0 * value / step < 0.5 and key != "comm_exposed_s"):
            continue
        out.append((f"{breakdown.LABELS[key]} {100.0 * value / step:.0f}%",
                    breakdown.STYLES[key]))
        if key == "comm_exposed_s" and bd.comm_overlap_s:
            out.append((f"(+{100.0 * bd.comm_overlap_s / step:.0f}% hidden)", "dim"))
    return out


class DevicePanel(Vertical):
    """Live view of one device, fed by :meth:`update_sample`; keeps its own history."""

    def __init__(self, device: str, label: str = "") -> None:
        super().__init__(id=panel_id(device), classes="device-panel")
        self.device = device
        self.border_title = device
        self.border_subtitle = label
        self.util_history: deque[float] = deque(maxlen=HISTORY)
        self.mem_history: deque[float] = deque(maxlen=HISTORY)
        self.last: DeviceSample | None = None
        self.sharing: tuple[str, ...] = ()  # other devices driven by the same process
        self.mfu: float | None = None
        self.memory: MemoryRow | None = None
        self.step_parts: Breakdown | None = None  # the last metered step's breakdown
        self.step_seen = False  # a StepMetrics has named this device
        self.comm_text = ""  # the last all-reduce bandwidth line (ddp ranks)
        self.energy0: float | None = None  # the energy counter at this panel's first reading
        self.samples_per_s: float | None = None  # the run's, at its last logged step

    def compose(self) -> ComposeResult:
        yield Meter("util", classes="util-meter")
        yield HistoryRow(100.0, classes="util-spark")
        yield Meter("mfu", classes="mfu-meter")
        yield Meter("mem", classes="mem-meter")
        yield HistoryRow(None, classes="mem-spark")
        yield TrainMemory()
        yield Static("temp n/a · power n/a", classes="dev-extra")
        yield StepBreakdown(classes="dev-breakdown")

    def update_breakdown(self, parts: Breakdown | None) -> None:
        """Show the device's last metered step (held until the panel is composed); None: its
        strategy measures nothing here (dp's other devices)."""
        self.step_parts, self.step_seen = parts, True
        if self.is_mounted and self.children:
            bar = self.query_one(StepBreakdown)
            bar.measured = parts is not None
            bar.parts = parts

    def update_comm(self, text: str) -> None:
        """The all-reduce bandwidth this device's rank achieved on the metered step (a line
        from ``comm_peak.text``), under the step bar."""
        self.comm_text = text
        if self.is_mounted and self.children:
            self.query_one(StepBreakdown).comm = text

    def on_mount(self) -> None:
        if self.last is not None:  # a reading that arrived before the panel was composed
            self._show(self.last)
        if self.mfu is not None:
            self.update_mfu(self.mfu)
        if self.memory is not None:
            self.update_memory(self.memory)
        if self.step_seen:
            self.update_breakdown(self.step_parts)
        if self.comm_text:
            self.update_comm(self.comm_text)

    def update_mfu(self, mfu: float | None) -> None:
        """The run's model FLOP utilization (StepMetrics.mfu)."""
        self.mfu = mfu
        if self.is_mounted and self.children:
            show_mfu(self.query_one(".mfu-meter", Meter), mfu)

    def update_rate(self, samples_per_s: float | None) -> None:
        """The run's samples/s (StepMetrics): with this GPU's power, its joules per sample."""
        self.samples_per_s = samples_per_s

    def update_memory(self, row: MemoryRow) -> None:
        """This device's training memory (a MemoryReport row)."""
        self.memory = row
        if self.is_mounted and self.children:
            self.query_one(TrainMemory).show(row)

    def update_sample(self, s: DeviceSample) -> None:
        """Show one reading (held until the panel is composed, when it is brand new)."""
        self.last = s
        if self.energy0 is None and s.energy_j is not None:
            self.energy0 = s.energy_j
        if self.is_mounted and self.children:
            self._show(s)

    def _show(self, s: DeviceSample) -> None:
        """Bars now, sparkline history, and what the device reports."""
        if s.name and not self.border_subtitle:
            self.border_subtitle = s.name
        util = s.util if s.util is not None else s.cpu_percent
        util_meter = self.query_one(".util-meter", Meter)
        if s.util is None and s.cpu_percent is not None:
            util_meter.label = "cpu"
        if util is not None:
            util_meter.fraction = min(util, 100.0) / 100.0
            util_meter.value_text = f"{util:5.1f}%"
            self.util_history.append(float(util))
            self.query_one(".util-spark", HistoryRow).data = tuple(self.util_history)
        else:
            util_meter.fraction, util_meter.value_text = None, "n/a"
        util_meter.refresh()
        self._show_memory(s)
        self.query_one(".dev-extra", Static).update(self.extra_text())

    def extra_text(self) -> str:
        """Temperature, power, the process, and which devices share that process (CPU
        virtual devices of scratch, dp or model_parallel are one process: the same pid,
        utilization and memory)."""
        s = self.last
        if s is None:
            return "temp n/a · power n/a"
        parts = []
        if s.cpu_percent is None or s.temp_c is not None or s.power_w is not None:
            power = fmt_opt(s.power_w, "W")
            if s.power_w is not None and s.power_limit_w:
                power += f" / {s.power_limit_w:.0f} W"
            parts.append(f"temp {fmt_opt(s.temp_c, '°C')} · power {power}")
        parts += gpu_truth(s, self.energy0, self.samples_per_s)
        if s.pid is not None:
            parts.append(f"pid {s.pid}")
        if self.sharing:  # short: the panel is narrow
            others = self.sharing[0] if len(self.sharing) == 1 else f"{len(self.sharing)} others"
            parts.append(f"one process with {others}")
        return " · ".join(parts) or "temp n/a · power n/a"

    def set_sharing(self, others: tuple[str, ...]) -> None:
        """The other devices whose samples come from this device's process."""
        if others != self.sharing:
            self.sharing = others
            if self.is_mounted and self.children:
                self.query_one(".dev-extra", Static).update(self.extra_text())

    def _show_memory(self, s: DeviceSample) -> None:
        meter = self.query_one(".mem-meter", Meter)
        used = s.mem_used
        if used is None:  # a CPU virtual device: its process's resident memory
            used = s.rss
            if used is not None:
                meter.label = "rss"
        total = s.mem_total
        if used is None:
            meter.fraction, meter.value_text = None, "n/a"
        else:
            meter.fraction = (used / total) if total else None
            meter.value_text = (f"{fmt_bytes(used)}/{fmt_bytes(total)}" if total
                                else fmt_bytes(used))
            self.mem_history.append(float(used))
            row = self.query_one(".mem-spark", HistoryRow)
            row.top = float(total) if total else None  # 0 to the device's total
            row.data = tuple(self.mem_history)
        meter.refresh()


def gpu_truth(s: DeviceSample, energy0: float | None,
              samples_per_s: float | None = None) -> list[str]:
    """What NVML says beyond utilization, each part only where the GPU gives it: GPM's SM and
    tensor-core activity (utilization counts any kernel running; these count real work),
    the energy used since the panel's first reading, and joules per sample now (power over
    the run's samples/s)."""
    out = []
    if s.sm_active is not None:
        out.append(f"SM {s.sm_active:.0f}%" + (f" · tensor {s.tensor_active:.0f}%"
                                                 if s.tensor_active is not None else ""))
    if s.energy_j is not None and energy0 is not None:
        used = s.energy_j - energy0
        out.append(f"{used / 1000:.1f} kJ" if used >= 1000 else f"{used:.0f} J")
    if s.energy_j is not None and s.power_w is not None and samples_per_s:
        out.append(f"{s.power_w / samples_per_s:.2g} J/sample")
    return out


def panel_id(device: str) -> str:
    """DOM id of a device's panel: 'cuda:1' -> 'dev-cuda-1'."""
    return "dev-" + device.replace(":", "-").replace(".", "-")
