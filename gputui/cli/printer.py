"""The headless printer: live progress on a terminal, plain lines elsewhere, a summary table.

It consumes the same events as the TUI and the run record. On a terminal it draws a rich
progress bar (epoch, loss, samples/s) and prints log lines above it; otherwise it prints one
plain line per event worth reading, so logs in CI stay greppable.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from gputui.core import breakdown, straggler
from gputui.core.config_schema import lr_scheduled
from gputui.core.events import (DeviceSample, EpochEnd, Event, FlopsInfo, InitDone, LogLine,
                                 RunFailed, RunFinished, RunStarted, RunStopped, Stalled,
                                 StepMetrics, acc_text, init_text, plural)
from gputui.core.moe_text import active_line, moe_lines
from gputui.core.runstore import RunSummary
from gputui.core.scores import perplexity, score_text, speed_text


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def device_line(samples: dict[str, DeviceSample]) -> str:
    """A compact one-line view of the latest sample of each device."""
    parts = []
    for name, s in sorted(samples.items()):
        if name == "cpu":  # the host line
            if s.util is None:
                continue
            text = f"host {s.util:.0f}% ram {_mib(s.mem_used)}/{_mib(s.mem_total)}"
        elif s.cpu_percent is not None:
            text = f"{name} cpu {s.cpu_percent:.0f}% rss {_mib(s.rss)}"
        elif s.util is not None:
            text = f"{name} {s.util:.0f}% mem {_mib(s.mem_used)}/{_mib(s.mem_total)}"
            if s.temp_c is not None:
                text += f" {s.temp_c:.0f}C"
            if s.power_w is not None:
                text += f" {s.power_w:.0f}W"
        else:
            continue
        parts.append(text)
    return " | ".join(parts)


def breakdown_lines(ev) -> list[str]:
    """Where the metered step's time went, one line per device that measured it (each rank
    of ddp/fsdp), e.g. 'cpu:0 step 5.1 ms: compute 76% · comm 9% (+3% hidden) · ...'; a pp
    stage adds its bubble, sends and receives."""
    out = []
    for row in ev.per_device:
        if row.breakdown:
            out.append(f"{row.device} {breakdown.line(row.breakdown)}")
            pipe = breakdown.pipeline_line(row)
            if pipe:
                out.append(f"{row.device} {pipe}")
            named = breakdown.collectives_line(row)
            if named and len(named.split(" · ")) > 1:  # one kind is the comm share already
                out.append(f"{row.device} collectives: {named}")
            again = breakdown.recompute_line(row)
            if again:
                out.append(f"{row.device} {again}")
    slow = straggler.find(ev.per_device)  # ddp/fsdp/tp: the rank the others waited for
    if slow is not None:
        out.append(straggler.line(slow) or "")
    return out + moe_lines(getattr(ev, "moe", None))  # a mixture of experts' routing


class Printer:
    """Turns events into terminal output; ``close()`` prints the summary."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None,
                 quiet: bool = False):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.quiet = quiet
        self.console = Console(file=self.stream, highlight=False,
                               force_terminal=self.live if live is not None else None)
        self.samples: dict[str, DeviceSample] = {}
        self.progress: Progress | None = None
        self.display: Live | None = None  # the progress bar with the device line under it
        self.devices_text = Text(style="dim")
        self.task: TaskID | None = None
        self.epochs = 1
        self.epochs_seen = 0  # the first epoch printed carries the warm-up
        self.show_lr = False  # a scheduled lr is printed with the loss

    def line(self, text: str, always: bool = False) -> None:
        """One line above the progress bar (or a plain line); ``always`` prints it under
        ``quiet`` too (the summary and the record's path)."""
        if self.quiet and not always:
            return
        if self.display is not None:
            self.display.console.print(text, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def handle(self, ev: Event) -> None:
        """Print what one event means for the user."""
        if isinstance(ev, DeviceSample):
            self.samples[ev.device] = ev
        elif isinstance(ev, RunStarted):
            devs = ", ".join(d["name"] for d in ev.devices)
            self.epochs = ev.config.run.epochs
            self.show_lr = lr_scheduled(ev.config.optim)
            self.line(f"run {ev.run_id}: strategy {ev.strategy} on {devs}")
            for note in ev.notes:
                self.line(f"note: {note}")
        elif isinstance(ev, LogLine):
            self.line(f"{ev.level}: {ev.message}")
        elif isinstance(ev, Stalled):  # a hang named (gputui.core.hang): always shown
            self.line(f"hang: {ev.message} (--stall-after {ev.threshold_s:.0f} s)",
                      always=True)
            for trace in ev.traces:
                self.line(f"  flight recorder: {trace}", always=True)
        elif isinstance(ev, InitDone):
            self.line(f"init {init_text(ev, 2)}; {ev.train_samples:,} training examples, "
                      f"{plural(ev.steps_per_epoch, 'step')} per epoch")
            self._start_progress(ev.steps_per_epoch * self.epochs)
        elif isinstance(ev, StepMetrics):
            self._step(ev)
        elif isinstance(ev, FlopsInfo) and ev.params_active:  # a mixture of experts
            self.line(active_line(ev.flops_per_step, ev.params_active, ev.params_total))
        elif isinstance(ev, EpochEnd):
            warm = "" if self.epochs_seen else " (warm-up included)"
            self.epochs_seen += 1
            score = score_text(getattr(ev, "task", "classify"), ev.test_acc,
                               getattr(ev, "val_loss", None))
            self.line(f"epoch {ev.epoch}/{ev.epochs}: {ev.seconds:.2f} s wall-clock, train loss "
                      f"{ev.train_loss:.4f}, {score}, "
                      f"{speed_text(ev.samples_per_s, ev.tokens_per_s)}{warm}")
        elif isinstance(ev, (RunFinished, RunStopped, RunFailed)):
            self._stop_progress()
            if isinstance(ev, RunFailed):
                self.line(f"run failed: {ev.reason}")
            elif isinstance(ev, RunStopped):
                self.line(f"run stopped: {ev.reason}")

    def _step(self, ev: StepMetrics) -> None:
        comm = f", comm {ev.comm_share:.1%}" if ev.comm_share is not None else ""
        speed = speed_text(ev.samples_per_s, getattr(ev, "tokens_per_s", None))
        lr = f", lr {ev.lr:.3g}" if self.show_lr else ""
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=ev.global_step,
                                 description=f"epoch {ev.epoch}/{self.epochs}",
                                 info=f"loss {ev.loss:.4f}{lr}  {speed}{comm}")
            lines = [device_line(self.samples), *breakdown_lines(ev)]
            self.devices_text.plain = "\n".join(t for t in lines if t)
            return
        self.line(f"epoch {ev.epoch} step {ev.step}/{ev.steps_per_epoch}: loss {ev.loss:.4f}{lr}, "
                  f"{speed}, step {ev.step_time_s * 1000:.1f} ms{comm}")
        devs = device_line(self.samples)
        if devs:
            self.line(f"  devices: {devs}")
        for text in breakdown_lines(ev):
            self.line(f"  {text}")

    def _start_progress(self, total: int) -> None:
        if not self.live or self.quiet:
            return
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=30),
            TextColumn("{task.completed}/{task.total} steps"), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=self.console)
        self.task = self.progress.add_task(f"epoch 1/{self.epochs}", total=total, info="")
        self.display = Live(Group(self.progress, self.devices_text), console=self.console,
                            transient=True, refresh_per_second=8)
        self.display.start()

    def _stop_progress(self) -> None:
        if self.display is not None:
            self.display.stop()
            self.display = None
            self.progress = None

    def summary(self, s: RunSummary, status: str = "", run_dir: str | Path = "",
                baseline_warning: str = "") -> None:
        """The end-of-run table (not under ``quiet``), then, always, the summary line and
        where the record is (``run_dir``). ``status``: the status shown when it is not the
        record's own (a watcher's "incomplete"); ``baseline_warning``: why its speed is no
        baseline (``core.trust.poisoned``)."""
        self._stop_progress()
        status = status or s.status_text
        table = Table(title=f"run {s.run_id or '?'}: {status}", show_header=True)
        table.add_column("epoch", justify="right")
        table.add_column("time (s)", justify="right")
        table.add_column("samples/s", justify="right")
        table.add_column("train loss", justify="right")
        lm = s.lm
        if lm:
            table.add_column("val loss", justify="right")
            table.add_column("val ppl", justify="right")
        else:
            table.add_column("test acc", justify="right")
        for e in s.per_epoch:
            score = ([f"{e.val_loss:.4f}", f"{perplexity(e.val_loss):,.2f}"] if lm
                     else [acc_text(e.test_acc) if e.test_acc is not None else "n/a"])
            table.add_row(str(e.epoch), f"{e.seconds:.2f}", f"{e.samples_per_s:,.0f}",
                          f"{e.train_loss:.4f}", *score)
        if self.live and not self.quiet:  # plain mode has printed one line per epoch
            self.console.print(table)
        init = s.init_s
        parts = [status_clause(status, s.reason)]
        if s.time_per_epoch_s is not None:
            steady = s.steady
            if steady:  # the steady state (gputui.core.steady): warm-up excluded
                per_epoch = steady.step_time_s * s.steps_per_epoch
                noise = f" ±{steady.noise:.0%}" if steady.noise is not None else ""
                # one figure per quantity: the steady one, and the wall-clock mean of the
                # per-epoch lines named as such beside it
                parts.append(f"time/epoch {per_epoch or s.time_per_epoch_s:.2f} s steady-"
                             f"state ({s.time_per_epoch_s:.2f} s wall-clock)")
                parts.append(f"{speed_text(steady.samples_per_s, steady.tokens_per_s)}"
                             f"{noise} (steady state, "
                             f"after {plural(steady.warmup_steps, 'warm-up step')})")
            else:
                parts.append(f"time/epoch {s.time_per_epoch_s:.2f} s wall-clock")
                parts.append(f"{speed_text(s.samples_per_s or 0.0, s.tokens_per_s)} "
                             f"(warm-up included: too "
                             f"few steps for a steady state)")
            parts.append(score_text(s.task or "classify", s.test_acc, s.val_loss))
            if lm and s.baseline_loss is not None:
                parts.append(f"unigram baseline {s.baseline_loss:.4f}")
        if init is not None:
            parts.append(f"init {init:.2f} s")
        self.line("summary: " + ", ".join(parts), always=True)
        if baseline_warning:  # contention poisoned its figures (core.trust.poisoned)
            self.line(f"warning: {baseline_warning}", always=True)
        if run_dir:
            self.line(f"record: {shown_path(run_dir)}", always=True)


def status_clause(status: Any, reason: str | None) -> str:
    """The summary line's first clause: "status finished", "status stopped by SIGINT (Ctrl-C)"
    (a reason that begins with its status reads on from it), "status failed: diverged"."""
    if not reason:
        return f"status {status}"
    first = str(reason).split(" ", 1)[0]
    if first == status:
        return f"status {reason}"
    return f"status {status}: {reason}"


def shown_path(path: str | Path) -> str:
    """A record's path as `run` and `resume` both print it: relative to the current folder
    when it lies under it (runs/<id>), else as it is."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)
