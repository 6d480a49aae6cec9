"""What every screen shows below the smallest terminal the app is laid out for.

The app's stylesheet sets size classes on each screen (``GpuTuiApp.HORIZONTAL_BREAKPOINTS``
and ``VERTICAL_BREAKPOINTS``); under ``MIN_SIZE`` this widget covers the screen with one
readable message instead of panels squashed past reading.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

MIN_SIZE = (80, 24)  # columns, rows


def too_small_text(width: int, height: int) -> str:
    """The message for a terminal of ``width`` x ``height``."""
    w, h = MIN_SIZE
    return (f"gputui needs a terminal of at least {w}x{h}; this one is {width}x{height}.\n"
            f"Enlarge the window (or make the font smaller). Ctrl+Q quits.")


class TooSmall(Static):
    """Covers the screen, shown by the stylesheet only under MIN_SIZE."""

    DEFAULT_CSS = """
    TooSmall {
        display: none; layer: too-small; dock: top; width: 100%; height: 100%;
        background: $background; color: $text-warning; content-align: center middle;
        text-align: center; padding: 1 2;
    }
    """

    def __init__(self) -> None:
        super().__init__("", classes="too-small")

    def render(self) -> Text:
        size = self.app.size
        return Text(too_small_text(size.width, size.height))
