"""The run's own output and warnings, with the UI's own remarks (stop requested, ...)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

LEVEL_STYLE = {"info": "", "warning": "bold yellow", "error": "bold red", "ui": "italic cyan"}
LEVEL_TAG = {"info": "     ", "warning": "warn ", "error": "ERROR", "ui": "gputui"}


class RunLog(RichLog):
    """A bounded log pane; lines are stamped with seconds since the run started."""

    def __init__(self, max_lines: int = 2000) -> None:
        super().__init__(id="run-log", max_lines=max_lines, wrap=True, markup=False,
                         highlight=False, auto_scroll=True, min_width=20)
        self.t0: float | None = None
        self.lines_written = 0
        self.plain: list[str] = []  # a plain copy of the last lines, for tests and search

    def add(self, level: str, message: str, t: float | None = None) -> None:
        """Write one line: '+12.3s warn  message'."""
        if self.t0 is None and t is not None:
            self.t0 = t
        stamp = f"+{t - self.t0:7.1f}s" if (t is not None and self.t0 is not None) else " " * 9
        tag = LEVEL_TAG.get(level, level[:5].ljust(5))
        style = LEVEL_STYLE.get(level, "")
        for i, part in enumerate(str(message).splitlines() or [""]):
            line = Text.assemble((stamp if i == 0 else " " * len(stamp), "dim"), " ",
                                 (tag if i == 0 else " " * len(tag), style), " ", (part, style))
            self.write(line)
            self.plain.append(f"{level} {part}")
        self.lines_written += 1
        if len(self.plain) > self.max_lines:
            del self.plain[: len(self.plain) - self.max_lines]
