"""A comparison table's cells as text, for the terminal, Markdown and the app: each figure in
its unit, and a speedup or efficiency with its noise beside it ("1.83x ±0.05"). Torch-free.
"""

from __future__ import annotations

from typing import Any

from gputui.core import breakdown, scores
from gputui.core.devices import human_bytes
from gputui.core.events import acc_text

# a figure's text by its column (the breakdown's shares first: a column named below as well
# takes its own format)
FORMATS: dict[str, Any] = {
    **{key: "{:.0%}".format for key in breakdown.SHARE_COLUMNS},
    "comm_share": "{:.1%}".format, "efficiency": "{:.1%}".format, "mfu": "{:.1%}".format,
    "bubble_share": "{:.0%}".format, "train_mem": human_bytes,
    "speedup": "{:.2f}x".format, "predicted_speedup": "{:.2f}x".format,
    "time_per_epoch_s": "{:.2f} s".format, "init_s": "{:.2f} s".format,
    "samples_per_s": "{:,.0f}".format, "step_ms": "{:.2f}".format,
    "mem_per_device": lambda v: f"{v / 2**20:,.1f} MiB", "comm_gbps": "{:.2f} GB/s".format,
    "test_acc": acc_text, "lr": "{:g}".format}


def cell(key: str, row: dict[str, Any]) -> str:
    """A table row's cell as text: ``fmt``, with a figure's noise beside it ("1.83x ±0.05")."""
    value = row.get(key)
    text = fmt(key, value)
    noise = row.get(f"{key}_noise")
    if key in ("speedup", "efficiency") and isinstance(value, (int, float)) and \
            noise is not None:
        text += f" ±{noise:.2f}" if key == "speedup" else f" ±{noise:.0%}"
    return text


def fmt(key: str, value: Any) -> str:
    """A cell as text for terminal and Markdown tables."""
    if value is None or value == "" or value != value:  # None, empty or NaN
        return "-"
    if isinstance(value, str) and key in ("speedup", "efficiency"):
        return value
    if key in FORMATS:
        return str(FORMATS[key](value))
    score = scores.fmt(key, value)  # the language models' columns (none of the above)
    return str(value) if score is None else score
