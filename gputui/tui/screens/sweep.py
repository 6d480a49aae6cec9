"""The sweep screen: the set-up's config over device counts x strategies, one run after
another, with the state of every point, then the scaling comparison.

The screen plans the sweep (:class:`gputui.runs.sweep.runner.Sweep`, the engine behind
`gputui sweep`, so the same manifest and resume rules apply) and asks the app to run it
(``StartSweep``, ``StopSweep``: :mod:`gputui.tui.app`); the app tells it how the
sweep goes through the messages below. Leaving the app stops the sweep: no run is started
after the app goes away.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Checkbox, DataTable, Footer, Header, Input, Label, Static

from gputui.core.config import ConfigError, RunConfig
from gputui.core.devices import wants_gpus
from gputui.core.events import plural
from gputui.core.usercode import code_line
from gputui.runs.sweep.runner import Point, Sweep, parse_devices
from gputui.runs.sweep.grid import spec_for
from gputui.tui.estimate import duration_words, same_work
from gputui.tui.messages import HistoryRead, OpenCompare, StartSweep, StopSweep, SweepStarted
from gputui.tui.widgets.plain_table import PlainTable
from gputui.tui.widgets.too_small import TooSmall


class PointChanged(Message):
    """A point started, ended or was skipped (a copy: the worker keeps mutating its own)."""

    def __init__(self, point: Point) -> None:
        super().__init__()
        self.point = Point(**vars(point))


class PointProgress(Message):
    """One line about the run in flight; a newer one replaces a queued older one."""

    def __init__(self, key: str, text: str) -> None:
        super().__init__()
        self.key, self.text = key, text

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PointProgress) and message.key == self.key


class SweepEnded(Message):
    """The sweep finished or was stopped (or could not run: ``error``)."""

    bubble = False  # the app posts one to the screen and one to itself

    def __init__(self, state: str, error: str = "") -> None:
        super().__init__()
        self.state, self.error = state, error


class SweepScreen(Screen):
    """Start, watch and stop a sweep; then compare its runs."""

    DEFAULT_CSS = """
    #sweep-form, #sweep-actions { height: 3; }
    #sweep-form Label { padding: 1 1 0 1; }
    #sweep-devices { width: 14; }
    #sweep-strategies { width: 1fr; }
    #sweep-points { height: 1fr; }
    #sweep-status, #sweep-plan { height: auto; padding: 0 1; }
    """
    BINDINGS = [
        Binding("ctrl+r", "start", "Start sweep", priority=True),
        Binding("ctrl+t", "stop", "Stop sweep", priority=True),
        Binding("ctrl+e", "compare", "Compare results", priority=True),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, config: RunConfig, runs_dir: str | Path, strategies: list[str], *,
                 screen_id: str = "sweep") -> None:
        super().__init__(id=screen_id)
        self.config, self.runs_dir = config, Path(runs_dir)
        self.default_strategies = strategies
        self.sweep: Sweep | None = None
        self.running = False
        self.state = "idle"  # idle | running | finished | interrupted | failed
        self.history: tuple | None = None  # this machine's earlier runs (None: not read yet)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="sweep-form"):
            yield Label("devices")
            yield Input("1,2", id="sweep-devices")
            yield Label("strategies")
            yield Input(",".join(self.default_strategies), id="sweep-strategies")
        # a row of its own: on one row with the inputs, 80 columns left the strategies 4
        with Horizontal(id="sweep-actions"):
            yield Checkbox("scale batch/lr with devices", id="sweep-scale")
            yield Button("Start", id="sweep-start", variant="primary")
            yield Button("Stop", id="sweep-stop", variant="warning", disabled=True)
        yield Static("", id="sweep-plan", markup=False)
        yield PlainTable(id="sweep-points", cursor_type="row")
        code = code_line(self.config)
        yield Static(f"Sweeps {self.config.run.name}: {self.config.model.label} on "
                     f"{self.config.data.label}, "
                     f"{plural(self.config.run.epochs, 'epoch')}{' · ⚠ ' + code if code else ''}. "
                     f"ctrl+r starts.", id="sweep-status", markup=False)
        yield Footer()
        yield TooSmall()

    def on_mount(self) -> None:
        self.sub_title = "sweep"
        table = self.query_one(DataTable)
        for label, key in (("point", "point"), ("devices", "spec"), ("status", "status"),
                           ("run", "run"), ("detail", "detail")):
            table.add_column(label, key=key)
        self.show_plan()
        self.read_history()

    @work(thread=True, exclusive=True, group="sweep-history", exit_on_error=False)
    def read_history(self) -> None:
        """This machine's earlier runs, off the UI thread (the estimate rests on them)."""
        from gputui.runs.history import load_rows

        try:
            rows = tuple(load_rows(self.runs_dir))
        except OSError:
            rows = ()
        self.post_message(HistoryRead(rows))

    def on_history_read(self, message: HistoryRead) -> None:
        self.history = message.rows
        self.show_plan()

    @on(Input.Changed, "#sweep-devices, #sweep-strategies")
    def _grid_changed(self) -> None:
        if not self.running:
            self.show_plan()

    def plan_text(self) -> str:
        """How many runs the form's grid makes, and how long they take by this machine's
        earlier runs of the same work (or that it does not know)."""
        strategies = list(dict.fromkeys(
            s.strip() for s in self.query_one("#sweep-strategies", Input).value.split(",")
            if s.strip()))
        try:
            devices = parse_devices(self.query_one("#sweep-devices", Input).value)
        except ConfigError as exc:
            return f"grid: {exc}"
        runs = len(devices) * len(strategies)
        text = (f"grid: {plural(len(devices), 'device count')} x "
                f"{plural(len(strategies), 'strategy').replace('strategys', 'strategies')} = "
                f"{plural(runs, 'run')}")
        if not runs:
            return text
        if self.history is None:
            return text + "; reading this machine's earlier runs for an estimate…"
        kind = "gpu" if wants_gpus(self.config.devices.spec) else "cpu"
        seconds, known = 0.0, 0
        for n in devices:
            spec = spec_for(n, kind)
            for name in strategies:
                try:
                    cfg = self.config.replace(strategy={"name": name}, devices={"spec": spec})
                except ConfigError:
                    continue
                count = int(n) if n.isdigit() else max(1, len(spec.split(",")))
                same = [r for r in self.history if same_work(r, cfg, count)]
                if same:  # the median earlier run of this point's work, start-up included
                    seconds += statistics.median(r.time_per_epoch_s * cfg.run.epochs
                                                 + (r.init_s or 0.0) for r in same)
                    known += 1
        if not known:
            return text + "; time unknown: none of them has run here before"
        rest = "" if known == runs else f" ({runs - known} never ran here: not counted)"
        took = duration_words(seconds) if seconds >= 60 else f"{seconds:.0f} s"
        return text + f"; about {took} by earlier runs here{rest}"

    def show_plan(self) -> None:
        self.query_one("#sweep-plan", Static).update(self.plan_text())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Start and Stop buttons."""
        if event.button.id == "sweep-start":
            self.action_start()
        elif event.button.id == "sweep-stop":
            self.action_stop()

    def action_start(self) -> None:
        """Plan the grid from the form and ask the app to run it (it says why not when a run
        is active)."""
        if self.running:
            return
        strategies = [s.strip() for s in self.query_one("#sweep-strategies", Input).value
                      .split(",") if s.strip()]
        try:
            devices = parse_devices(self.query_one("#sweep-devices", Input).value)
            if not strategies:
                raise ConfigError("strategies: give at least one, e.g. single,scratch")
            # the counts are of the kind the set-up chose: GPUs when it chose GPUs
            kind = "gpu" if wants_gpus(self.config.devices.spec) else "cpu"
            sweep = Sweep.from_config(self.config, devices, strategies,
                                      self.query_one("#sweep-scale", Checkbox).value,
                                      self.runs_dir, kind)
        except (ConfigError, OSError) as exc:
            self.notify(str(exc), title="Cannot start the sweep", severity="error")
            return
        self.post_message(StartSweep(sweep, self))

    def on_sweep_started(self, message: SweepStarted) -> None:
        """The app runs the sweep: its points, then their news as they come."""
        self.sweep = message.sweep
        table = self.query_one(DataTable)
        table.clear()
        for p in self.sweep.manifest.points:
            table.add_row(p.key, p.spec, p.status, "", "", key=p.key)
        self._set_running(True)
        self.query_one("#sweep-status", Static).update(
            f"sweep {self.sweep.manifest.sweep_id} over {self.sweep.manifest.kind_words()}: "
            f"running (ctrl+t stops after a clean stop "
            f"of the current run)")

    def _set_running(self, running: bool) -> None:
        self.running = running
        self.state = "running" if running else self.state
        self.query_one("#sweep-start", Button).disabled = running
        self.query_one("#sweep-stop", Button).disabled = not running

    def on_point_changed(self, message: PointChanged) -> None:
        """Show a point's new state."""
        p = message.point
        table = self.query_one(DataTable)
        # the columns widen to what they hold: a status, a run id, a reason are read whole
        table.update_cell(p.key, "status", p.status, update_width=True)
        table.update_cell(p.key, "run", p.run_id, update_width=True)
        table.update_cell(p.key, "detail", p.reason, update_width=True)

    def on_point_progress(self, message: PointProgress) -> None:
        """The run in flight's latest figures."""
        self.query_one(DataTable).update_cell(message.key, "detail", message.text,
                                              update_width=True)

    def on_sweep_ended(self, message: SweepEnded) -> None:
        """Say how the sweep ended; ctrl+e compares its runs."""
        self.state = message.state
        self._set_running(False)
        sweep_id = self.sweep.manifest.sweep_id if self.sweep is not None else "?"
        text = {"finished": "finished", "interrupted": "stopped (resume it with "
                f"gputui sweep --resume {sweep_id})",
                "failed": f"failed: {message.error}"}.get(message.state, message.state)
        self.query_one("#sweep-status", Static).update(f"sweep {text}. ctrl+e compares the "
                                                       f"runs.")

    def action_stop(self) -> None:
        """Stop the current run cleanly and start no other."""
        if self.running and self.sweep is not None:
            self.post_message(StopSweep())
            self.query_one("#sweep-status", Static).update("stopping after the current run "
                                                           "stops…")

    def action_compare(self) -> None:
        """The comparison of the sweep's runs (speedup against devices)."""
        if self.sweep is None or not self.sweep.run_dirs():
            self.notify("No run of this sweep has a record yet", severity="warning")
            return
        self.post_message(OpenCompare(self.sweep.run_dirs(), self.runs_dir,
                                      title=f"sweep {self.sweep.manifest.sweep_id}",
                                      only_compared=True))

    def action_back(self) -> None:
        """Back to the set-up (not while a sweep runs)."""
        if self.running:
            self.notify("A sweep is running: stop it first (ctrl+t)", severity="warning")
            return
        self.app.pop_screen()
