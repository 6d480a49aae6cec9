"""Small formatting helpers shared by the widgets (pure functions, tested directly)."""

from __future__ import annotations

import math
import re

from gputui.core.devices import human_bytes

# one formatter for bytes everywhere (the CLI's device table uses the same)
fmt_bytes = human_bytes


def fmt_duration(seconds: float | None) -> str:
    """75.2 -> '1:15'; 3725 -> '1:02:05'; None -> '--:--'."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_rate(x: float | None) -> str:
    """Samples per second with a thousands separator, or 'n/a'."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}"


def fmt_opt(value: float | None, unit: str, digits: int = 0) -> str:
    """'64 °C' or 'n/a' for a reading the device does not report."""
    if value is None:
        return "n/a"
    return f"{value:.{digits}f} {unit}"


def bar_text(fraction: float | None, width: int) -> str:
    """A text bar with eighth-block resolution; an empty track for an unknown value."""
    width = max(1, width)
    if fraction is None:
        return "·" * width
    fraction = min(1.0, max(0.0, fraction))
    eighths = int(round(fraction * width * 8))
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    text = "█" * full + partial
    return text + " " * (width - len(text))


def eta_seconds(done_steps: int, total_steps: int, step_time_s: float | None,
                epochs_left_evals: int = 0, eval_s: float = 0.0) -> float | None:
    """Time left: the remaining steps at the recent step time, plus the evaluations left."""
    if step_time_s is None or total_steps <= 0:
        return None
    remaining = max(0, total_steps - done_steps)
    return remaining * step_time_s + epochs_left_evals * eval_s


def thin(points: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    """At most ``limit`` points, evenly picked, the last one always kept (for plotting)."""
    n = len(points)
    if n <= limit or limit < 2:
        return list(points)
    step = (n - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


_DEVICES_FLAG = re.compile(r"--devices ('?)(cpu\*(\d+)|cpu|[^\s',;)]+)\1")
_SPEC_GIVES = re.compile(r"devices\.spec '([^']*)' gives (\d+)")
_FLAG_ASIDE = re.compile(r" \(--[a-z][a-z-]*\)")
_SET_FLAG = re.compile(r"--set ([a-z_]+\.[a-z_]+)=")


def app_terms(text: str) -> str:
    """A rule's sentence, written for the command line, in the app's terms: what to choose
    where, not which flag to pass ("use --devices cpu" -> "choose 1 CPU device (Devices,
    F2)"). Text without a flag is returned as it is."""
    def devices(m: re.Match) -> str:
        if m.group(3):
            return f"{m.group(3)} CPU devices (Devices, F2: the CPU count under the table)"
        if m.group(2) == "cpu":
            return "1 CPU device (Devices, F2)"
        return f"devices {m.group(2)} (Devices, F2)"

    text = _SPEC_GIVES.sub(r"the chosen devices (\1) are \2", text)
    text = _DEVICES_FLAG.sub(devices, text)
    text = text.replace("with tp_size", "with TP group size")
    text = _FLAG_ASIDE.sub("", text)
    return _SET_FLAG.sub(r"\1 = ", text)
