"""The run's own output and warnings, with the UI's own remarks (stop requested, ...)."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.events import Resize
from textual.widgets import RichLog

LEVEL_STYLE = {"info": "", "warning": "bold yellow", "error": "bold red", "ui": "italic cyan"}
LEVEL_TAG = {"info": "     ", "warning": "warn ", "error": "ERROR", "ui": "gputui"}


class RunLog(RichLog):
    """A bounded log pane; lines are stamped with seconds since the run started.

    It keeps its entries and re-wraps them when its width changes: RichLog wraps a line once,
    at the width it has when written, which is wrong for lines written while the screen is
    still being laid out, and after the terminal is resized.
    """

    def __init__(self, max_lines: int = 2000) -> None:
        super().__init__(id="run-log", max_lines=max_lines, wrap=True, markup=False,
                         highlight=False, auto_scroll=True, min_width=20)
        self.t0: float | None = None
        self.lines_written = 0
        self.entries: deque[tuple[str, str, float | None]] = deque(maxlen=max_lines)
        self._wrapped_at = 0

    @property
    def plain(self) -> list[str]:
        """Each line as 'level message' (for tests and search)."""
        return [f"{level} {part}" for level, message, _ in self.entries
                for part in (str(message).splitlines() or [""])]

    def add(self, level: str, message: str, t: float | None = None) -> None:
        """Write one entry: '+12.3s warn  message'."""
        if self.t0 is None and t is not None:
            self.t0 = t
        self.entries.append((level, message, t))
        self.lines_written += 1
        if self._wrapped_at:  # else the first resize writes it, at the right width
            self.write(self._render_entry(level, message, t), width=self._wrapped_at)

    def _render_entry(self, level: str, message: str, t: float | None) -> Text:
        stamp = f"+{t - self.t0:.1f}s".rjust(9) if (t is not None and self.t0 is not None) \
            else " " * 9
        tag = LEVEL_TAG.get(level, level[:5].ljust(5))
        style = LEVEL_STYLE.get(level, "")
        text = Text()
        for i, part in enumerate(str(message).splitlines() or [""]):
            if i:
                text.append("\n")
            text.append_text(Text.assemble((stamp if i == 0 else " " * len(stamp), "dim"), " ",
                                           (tag if i == 0 else " " * len(tag), style), " ",
                                           (part, style)))
        return text

    def on_resize(self, event: Resize) -> None:
        # The width RichLog would pick is capped by the app console's width, which is not
        # the widget's: wrap at the widget's width (less a scrollbar) explicitly.
        width = max(20, event.size.width - 2)
        if event.size.width and width != self._wrapped_at:
            self._wrapped_at = width
            self.clear()
            for entry in self.entries:
                self.write(self._render_entry(*entry), width=width)
