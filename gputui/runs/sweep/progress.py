"""Live progress of a sweep: rich bars on a terminal, one plain line per change elsewhere.

Two bars: the grid (points done of all) and the run in flight (steps over all its epochs,
with its loss and samples/s). Off a terminal (CI, logs, tests) every point start, epoch and
end is one greppable line instead.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gputui.core import machine
from gputui.core.scores import score_text, speed_text
from gputui.runs.sweep.runner import Point


class SweepProgress:
    """Receives ``on_point`` / ``on_event`` calls from
    :meth:`gputui.runs.sweep.runner.Sweep.run`."""

    def __init__(self, points: list[Point], stream: TextIO | None = None,
                 live: bool | None = None, epochs: int = 1):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.keys = [p.key for p in points]
        self.total, self.epochs = len(points), epochs
        self.done = sum(p.status == "finished" for p in points)
        self.console = Console(file=self.stream, highlight=False)
        self.progress: Progress | None = None
        self.grid_task: TaskID | None = None
        self.run_task: TaskID | None = None

    def __enter__(self) -> "SweepProgress":
        if self.live:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                     console=self.console)
            self.progress.start()
            self.grid_task = self.progress.add_task("sweep", total=self.total,
                                                    completed=self.done, info="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def line(self, text: str) -> None:
        """A line above the bars (or a plain line)."""
        if self.progress is not None:
            self.progress.console.print(text, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def _tag(self, point: Point) -> str:
        n = self.keys.index(point.key) + 1 if point.key in self.keys else "?"
        return f"[{n}/{self.total}] {point.strategy} on {point.spec}"

    def on_point(self, point: Point) -> None:
        """A point started, ended or was skipped."""
        tag = self._tag(point)
        if point.status == "running":
            self.line(f"{tag}: started run {point.run_id}")
            if self.progress is not None:
                if self.run_task is not None:
                    self.progress.remove_task(self.run_task)
                self.run_task = self.progress.add_task(f"{point.key}", total=None, info="init")
            return
        if point.status == "skipped":
            self.line(f"{tag}: skipped: {point.reason}")
        else:
            extra = f": {point.reason}" if point.reason else ""
            busy = machine.note(point.machine)
            self.line(f"{tag}: {point.status}{extra}" + (f"; {busy}" if busy else ""))
        self.done += 1
        if self.progress is not None and self.grid_task is not None:
            self.progress.update(self.grid_task, completed=self.done)

    def on_event(self, point: Point, ev: Any) -> None:
        """An event of the run in flight."""
        kind = ev.kind
        if kind == "init_done" and self.progress is not None and self.run_task is not None:
            self.progress.update(self.run_task, info="training")
        elif kind == "step" and self.progress is not None and self.run_task is not None:
            total = ev.steps_per_epoch * self.epochs
            self.progress.update(self.run_task, total=total, completed=ev.global_step,
                                 info=f"loss {ev.loss:.4f}  {ev.samples_per_s:,.0f} samples/s")
        elif kind == "epoch_end":
            warm = " (warm-up included)" if ev.epoch == 1 else ""
            speed = speed_text(ev.samples_per_s, ev.tokens_per_s)
            score = score_text(ev.task, ev.test_acc, ev.val_loss)
            self.line(f"{self._tag(point)}: epoch {ev.epoch}/{ev.epochs}: {ev.seconds:.2f} s "
                      f"wall-clock, "
                      f"{speed}{warm}, loss {ev.train_loss:.4f}, {score}")
        elif kind == "log" and ev.level in ("warning", "error"):
            self.line(f"{self._tag(point)}: {ev.level}: {ev.message}")

