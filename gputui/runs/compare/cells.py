"""A comparison table's cells as text, for the terminal, Markdown and the app: each figure in
its unit, and a speedup or efficiency with its noise beside it ("1.83x ±0.05"). Torch-free.
"""

from __future__ import annotations

from typing import Any

from gputui.core import breakdown, scores
from gputui.core.devices import human_bytes
from gputui.core.events import acc_text

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
    if key in ("comm_share", "efficiency", "mfu"):
        return f"{value:.1%}"
    if key == "bubble_share":
        return f"{value:.0%}"
    if key == "train_mem":
        return human_bytes(value)
    if key in breakdown.SHARE_COLUMNS:
        return f"{value:.0%}"
    if key == "speedup":
        return f"{value:.2f}x"
    if key in ("time_per_epoch_s", "init_s"):
        return f"{value:.2f} s"
    if key == "samples_per_s":
        return f"{value:,.0f}"
    if key == "step_ms":
        return f"{value:.2f}"
    if key == "mem_per_device":
        return f"{value / 2**20:,.1f} MiB"
    if key == "predicted_speedup":
        return f"{value:.2f}x"
    if key == "comm_gbps":
        return f"{value:.2f} GB/s"
    if key == "test_acc":
        return acc_text(value)
    score = scores.fmt(key, value)
    if score is not None:
        return score
    if key == "lr":
        return f"{value:g}"
    return str(value)
