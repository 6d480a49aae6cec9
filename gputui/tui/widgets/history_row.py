"""A one-line history of a device reading drawn on an absolute scale.

Textual's Sparkline scales each panel to its own minimum and maximum, so 0.7 % utilization
drew solid blocks and a host at a steady 100 % drew "▁▁▁▁". Here the scale is fixed: 0 to 100 %
for utilization, 0 to the device's total for memory; the newest reading is at the right, one
cell per reading.
"""

from __future__ import annotations

import math

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

LEVELS = " ▁▂▃▄▅▆▇█"  # 0 is blank; anything above 0 shows at least the lowest block


def history_text(values: list[float], top: float | None, width: int) -> str:
    """The last ``width`` values as blocks, each a share of ``top`` (None or 0: of the
    largest value shown, the only scale left when the total is unknown)."""
    shown = values[-width:] if width > 0 else []
    scale = top if top else max(shown, default=0.0)
    out = []
    for v in shown:
        frac = min(1.0, max(0.0, v / scale)) if scale else 0.0
        out.append(LEVELS[min(8, math.ceil(frac * 8))])
    return "".join(out).rjust(max(0, width))


class HistoryRow(Widget):
    """One line: the readings so far against ``top`` (the scale's full height)."""

    DEFAULT_CSS = "HistoryRow { height: 1; }"
    COMPONENT_CLASSES = {"history--bar"}
    data: reactive[tuple[float, ...]] = reactive(())
    top: reactive[float | None] = reactive(None)

    def __init__(self, top: float | None = None, *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self.set_reactive(HistoryRow.top, top)

    def render(self) -> Text:
        return Text(history_text(list(self.data), self.top, self.size.width),
                    style=self.get_component_rich_style("history--bar", partial=True),
                    no_wrap=True, end="")
