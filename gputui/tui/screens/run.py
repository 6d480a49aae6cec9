"""The run screen: live device panels, loss/accuracy/throughput plots, epochs, the log; its
layout at each size and its controls (Stop, Kill, leaving).

The app pumps the run's events and samples (:mod:`gputui.tui.pump`, from
:mod:`gputui.tui.run_control`) and posts them here; the handlers only update widgets. The
screen can also be fed directly (``apply_events``) by tests.
"""

from __future__ import annotations

import math
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.worker import Worker, WorkerState
from textual.widgets import Footer, Header, Static

from gputui.core import breakdown, straggler
from gputui.core.devices import backend_for
from gputui.runs.predict import comm_peak
from gputui.core.events import (DeviceSample, EpochEnd, Event, FlopsInfo, InitDone, LogLine,
                           MemoryReport, RunFailed, RunFinished, RunStarted, RunStopped,
                           Stalled, Status, StepMetrics, init_text, plural)
from gputui.core.scores import score_text
from gputui.tui.messages import (ControlRun, DeviceSamples, PumpFailed, RunControlled,
                                 RunEventBatch, SummaryRead)
from gputui.tui.screens.dialogs import ChoiceDialog
from gputui.tui.widgets.device_panel import DevicePanel, panel_id
from gputui.tui.widgets.epoch_table import EpochTable
from gputui.tui.widgets.hw_figures import flops_line
from gputui.tui.widgets.plots import AccuracyPlot, LossPlot, MetricPlot, ThroughputPlot
from gputui.tui.widgets.run_log import RunLog
from gputui.tui.widgets.run_status import RunStatus
from gputui.tui.widgets.too_small import TooSmall

ENDED = tuple(s.value for s in Status if s is not Status.RUNNING)
FULL_SIZE = (160, 45)  # the smallest terminal that shows every panel at once
PLOT_EVERY_S = 0.5  # plots follow the run twice a second, whatever the event rate


class RunScreen(Screen):
    """Watches one run; Stop keeps its record, Kill ends it now, Escape goes back.

    What it shows depends on its size: every panel from 160x45 up, else the charts or the
    devices, one plot at a time beside the epoch table (``compact``). It does not stop or
    kill the run itself: it posts ``ControlRun`` to the app, which owns the run's lifecycle
    (``gputui.tui.run_control``), and shows the run as stopping when the app answers with
    ``RunControlled``; leaving never orphans a run."""

    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("k", "kill", "Kill"),
        Binding("escape", "back", "Set-up"),
        Binding("l", "focus_log", "Log"),
        Binding("t", "time_axis", "Time axis"),
        Binding("d", "toggle_devices", "Devices"),
        Binding("p", "next_plot", "Next plot"),
    ]
    state: reactive[str] = reactive("starting")
    time_axis: reactive[bool] = reactive(False)  # plots against elapsed time, not steps
    show_devices: reactive[bool] = reactive(False)  # compact layouts: devices, not charts
    plot_index: reactive[int] = reactive(0)  # compact layouts: the one plot shown

    def __init__(self, handle: Any = None, config: Any = None) -> None:
        super().__init__(id="run")
        self.handle = handle
        self.config = config
        self.run_id = str(getattr(handle, "run_id", "") or "")
        # a run started elsewhere, followed from its record (gputui.runs.follow): no controls
        self.read_only = bool(getattr(handle, "read_only", False))
        self.devices = list(getattr(handle, "devices", []) or [])
        self.terminal: Event | None = None
        self.events_handled = 0
        self.batches_handled = 0
        self.display_errors: list[str] = []  # bugs caught while showing events (tests: empty)
        self._started_ev: RunStarted | None = None
        self._comm_peak: list[float | None] | None = None  # bench-comm's kept peak, read once
        # device -> its panel: a DOM query per event cost ~3 ms, seconds for a burst of steps
        self._panels: dict[str, DevicePanel] = {}

    @property
    def ended(self) -> bool:
        """The run reached its terminal event (finished, stopped or failed)."""
        return self.state in ENDED

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunStatus(self.run_id)
        yield Static("", id="run-views", markup=False)
        with Horizontal(id="run-body"):
            with VerticalScroll(id="device-panels"):
                for d in self.devices:
                    yield DevicePanel(d.name, getattr(d, "label", ""))
            with Grid(id="charts"):
                yield LossPlot()
                yield AccuracyPlot()
                yield ThroughputPlot()
                yield EpochTable()
        yield RunLog()
        yield Footer()
        yield TooSmall()

    def on_mount(self) -> None:
        self.sub_title = f"run · {self.run_id}" if self.run_id else "run"
        if self.read_only:
            self.sub_title = f"watching · {self.run_id}"
            self.log_ui(f"{self.handle.started_here()}; followed from its record, read-only "
                        f"(stop it where it runs)")
        self.query_one("#device-panels").border_title = "Devices"
        self.query_one(RunLog).border_title = "Log"
        self.set_interval(PLOT_EVERY_S, self.redraw_plots)
        for panel in self.query(DevicePanel):
            self._panels[panel.device] = panel
        self._lay_out()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("toggle_devices", "next_plot") and not self.compact:
            return False  # every panel shows: nothing to switch
        if action == "next_plot" and self.show_devices:
            return False
        if action in ("stop", "kill") and (self.ended or self.handle is None or self.read_only):
            return False  # not offered: nothing left to stop, or a run watched read-only
        return True

    # ------------------------------------------------------------------ what the app posts
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A worker that died is reported in the log, never as a crash."""
        if event.state == WorkerState.ERROR:
            self.log_ui(f"internal error in {event.worker.name}: {event.worker.error}", "error")

    def on_run_event_batch(self, message: RunEventBatch) -> None:
        """Everything but device samples, in order; acknowledged so the next may come."""
        try:
            if message.dropped_logs:
                self.log_ui(f"{message.dropped_logs} log lines skipped in a burst "
                            f"(the run folder's events.jsonl has them all)", "warning")
            self.apply_events(message.events)
            self.batches_handled += 1
        except Exception as exc:  # noqa: BLE001 - a display bug must not end the app (or run)
            self._display_error(exc)
        finally:
            message.ack()

    def on_device_samples(self, message: DeviceSamples) -> None:
        """The latest reading of every device."""
        try:
            status = self.query_one(RunStatus)
            for sample in message.samples:
                self.show_sample(sample)
                status.touch(sample.t)  # "elapsed" moves on during a long init too
            self.mark_shared_processes()
            status.redraw(ended=self.ended, finished=self.state == "finished")
        except Exception as exc:  # noqa: BLE001
            self._display_error(exc)
        finally:
            message.ack()

    def _display_error(self, exc: Exception) -> None:
        self.display_errors.append(f"{type(exc).__name__}: {exc}")
        self.log_ui(f"internal error while showing the run: {type(exc).__name__}: {exc}",
                    "error")

    def on_pump_failed(self, message: PumpFailed) -> None:
        """The handle broke: say so; the run's record may still be complete on disk."""
        self.log_ui(f"lost contact with the run: {message.error}", "error")
        self.notify(f"Lost contact with the run: {message.error}", severity="error")
        if not self.ended:
            self.state = "failed"

    # ------------------------------------------------------------------ events -> widgets
    def apply_events(self, events: tuple[Event, ...] | list[Event]) -> None:
        """Show a batch of events: the status line is redrawn once per batch, the plots at
        most every PLOT_EVERY_S (rebuilding a plot is the costliest thing the screen does)."""
        status = self.query_one(RunStatus)
        loss, thr = self.query_one(LossPlot), self.query_one(ThroughputPlot)
        log = self.query_one(RunLog)
        for ev in events:
            self.events_handled += 1
            status.touch(ev.t)
            if isinstance(ev, StepMetrics):
                loss.add_point(ev.global_step, ev.loss, ev.t)
                thr.add_point(ev.global_step, ev.tokens_per_s or ev.samples_per_s, ev.t)
                status.step_metrics(ev)
                self._show_breakdown(ev)
                for panel in self._panels.values():
                    panel.update_rate(ev.samples_per_s)
                    if ev.mfu is not None:
                        panel.update_mfu(ev.mfu)
                if self.state == "starting":
                    self.state = "running"
            elif isinstance(ev, MemoryReport):
                for row in ev.per_device:
                    self._panel(row.device).update_memory(row)
            elif isinstance(ev, FlopsInfo):
                log.add("info", flops_line(ev), ev.t)
            elif isinstance(ev, DeviceSample):
                self.show_sample(ev)
            elif isinstance(ev, LogLine):
                log.add(ev.level, ev.message, ev.t)
            elif isinstance(ev, Stalled):  # a hang named: which rank, where, how long
                log.add("error", f"hang: {ev.message} (--stall-after "
                                 f"{ev.threshold_s:.0f} s)", ev.t)
                for trace in ev.traces:
                    log.add("info", f"flight recorder: {trace}", ev.t)
            elif isinstance(ev, EpochEnd):
                lm = ev.task == "lm"
                self.query_one(AccuracyPlot).add_point(
                    ev.epoch, ev.val_loss if lm and ev.val_loss is not None else ev.test_acc * 100)
                self.query_one(EpochTable).add_epoch(ev)
                status.epoch_end(ev)
                held_out = ev.val_loss if lm else ev.test_loss
                if held_out is not None and math.isfinite(held_out):  # beside the training loss
                    loss.add_extra("validation" if lm else "test", ev.epoch *
                                   status.steps_per_epoch, held_out, ev.t)
                log.add("info", f"epoch {ev.epoch}/{ev.epochs}: {ev.seconds:.1f} s, train loss "
                                f"{ev.train_loss:.4f}, "
                                f"{score_text(ev.task, ev.test_acc, ev.val_loss)}"
                                + ("" if lm or ev.test_loss is None
                                   else f", test loss {ev.test_loss:.4f}"), ev.t)
            elif isinstance(ev, RunStarted):
                self._started(ev, status, log)
            elif isinstance(ev, InitDone):
                status.init_done(ev)
                if ev.task == "lm":  # the panels say what a language model shows
                    self.query_one(AccuracyPlot).language_model(ev.baseline_loss)
                    thr.language_model()
                    self.query_one(EpochTable).language_model()
                log.add("info", f"ready in {init_text(ev)} · "
                                f"{ev.train_samples:,} train / {ev.test_samples:,} test samples"
                                f" · {ev.params:,} parameters", ev.t)
                if self.state == "starting":
                    self.state = "running"
            elif isinstance(ev, (RunFinished, RunStopped, RunFailed)):
                self._ended(ev, log)
        if self.ended:
            self.redraw_plots()
        status.redraw(ended=self.ended, finished=self.state == "finished")

    def redraw_plots(self) -> None:
        """Rebuild the plots whose data changed since their last drawing."""
        for plot in self.query(MetricPlot):
            plot.redraw()

    def _started(self, ev: RunStarted, status: RunStatus, log: RunLog) -> None:
        self._started_ev = ev
        for plot in (self.query_one(LossPlot), self.query_one(ThroughputPlot)):
            plot.set_time_axis(self.time_axis, ev.t)
        self.run_id = ev.run_id
        if not getattr(self.app, "quitting", False):
            # a run that starts as the app quits: Textual's Header would look for its title
            # widget, already gone (NoMatches in its watcher), so the title is left as it is
            self.sub_title = f"{'watching' if self.read_only else 'run'} · {ev.run_id}"
        status.started(ev)
        for d in ev.devices:
            if isinstance(d, dict) and d.get("name"):
                self._panel(d["name"], d.get("label", ""))
        log.add("info", f"run {ev.run_id} started: strategy {ev.strategy}, "
                        f"{plural(len(ev.devices), 'device')}, world size {ev.world_size}", ev.t)
        for note in ev.notes:
            log.add("warning", str(note), ev.t)
        self._show_mesh(ev, log)

    def _show_mesh(self, ev: RunStarted, log: RunLog) -> None:
        """A mesh strategy's run: each device panel says what its rank holds, and the log the
        mesh once."""
        from gputui.core.mesh import MESH_STRATEGIES, mesh_of, rank_label

        if ev.strategy not in MESH_STRATEGIES or not ev.world_size:
            return
        try:
            shape = mesh_of(ev.config, ev.world_size)
        except Exception:  # noqa: BLE001 - degrees that form no mesh: none shown
            return
        names = [d["name"] for d in ev.devices if isinstance(d, dict) and d.get("name")]
        if len(names) != shape.world:
            return
        for rank, name in enumerate(names):
            panel = self._panels.get(name)
            if panel is not None and rank_label(shape, rank):
                panel.border_title = f"{name} · {rank_label(shape, rank)}"
        levers = f" ({shape.levers()})" if shape.levers() else ""
        log.add("info", f"mesh {shape.describe()}{levers}", ev.t)

    def _ended(self, ev: Event, log: RunLog) -> None:
        self.terminal = ev
        self.state = Status.of(ev).value  # decided where every run's status is
        if isinstance(ev, RunFinished):
            log.add("info", f"run finished in {ev.seconds:.1f} s", ev.t)
            self.notify("Run finished", timeout=5)
        elif isinstance(ev, RunStopped):
            log.add("warning", f"run {self.state}: {ev.reason}", ev.t)
            self.notify(f"Run {self.state} ({ev.reason})", timeout=5)
        elif isinstance(ev, RunFailed):  # the terminal kinds are these three
            log.add("error", f"run failed: {ev.reason}", ev.t)
            if ev.detail:  # a traceback: kept in the record for a bug report, not shown here
                where = getattr(self.handle, "run_dir", None)
                log.add("info", f"the traceback is in the record "
                                f"({where / 'events.jsonl' if where else 'events.jsonl'}, "
                                f"the run_failed event's detail)", ev.t)
            self.notify(ev.reason, title="Run failed", severity="error", timeout=15)
        self.load_summary()

    def _panel(self, device: str, label: str = "") -> DevicePanel:
        panel = self._panels.get(device)
        if panel is None:
            found = self.query(f"#{panel_id(device)}")
            if found:
                panel = found.first(DevicePanel)
            else:
                panel = DevicePanel(device, label)
                self.query_one("#device-panels").mount(panel)
            self._panels[device] = panel
        return panel

    def _show_breakdown(self, ev: StepMetrics) -> None:
        """Each device's part of the metered step (rows only on the logged, timed steps), and
        the all-reduce bandwidth its rank achieved beside bench-comm's peak where kept."""
        slow = straggler.find(ev.per_device)  # the rank the others waited for, if any
        for row in ev.per_device:
            if row.breakdown is not None or ev.breakdown is not None:
                self._panel(row.device).update_breakdown(row.breakdown)
            lines = []
            if row.comm_gbps is not None:
                lines.append(comm_peak.text(row.comm_gbps, self.comm_peak()))
            pipe = breakdown.pipeline_line(row)  # a pp stage: its bubble, sends and receives
            if pipe:
                lines.append(pipe)
            named = breakdown.collectives_line(row)  # each kind of collective, by name
            if named and len(named.split(" · ")) > 1:
                lines.append(named)
            again = breakdown.recompute_line(row)  # activation checkpointing's recompute
            if again:
                lines.append(again)
            if slow is not None and slow.significant() and slow.device == row.device:
                lines.append(straggler.line(slow) or "")
            experts = self._moe_line(ev, row)  # ep: the tokens this rank's experts took
            if experts:
                lines.append(experts)
            if lines or row.forward_s is not None:
                self._panel(row.device).update_comm("\n".join(lines))

    def _moe_line(self, ev: StepMetrics, row: Any) -> str | None:
        """A mixture of experts' routing on a device panel: under ep, the tokens its rank's
        experts took against the mean (the imbalance); else every expert's, on the first."""
        from gputui.core.moe_text import moe_lines, rank_line

        moe = getattr(ev, "moe", None)
        if not moe:
            return None
        ep = int(moe.get("ep") or 1)
        if ep > 1 and row.rank is not None:
            return rank_line(moe, row.rank % ep)
        return "\n".join(moe_lines(moe)) if row is ev.per_device[0] else None

    def comm_peak(self) -> float | None:
        """bench-comm's kept peak for this run's devices, kind and backend (read once)."""
        if self._comm_peak is None:
            self._comm_peak = [None]
            ev = self._started_ev
            if ev is not None and ev.devices:
                kind = str(ev.devices[0].get("kind", "cpu"))
                backend = backend_for(ev.config.strategy.backend, kind)
                try:
                    self._comm_peak = [comm_peak.peak(kind, ev.world_size, backend)]
                except (OSError, ValueError, KeyError, TypeError):
                    pass  # no kept figure: the bandwidth is shown alone
        return self._comm_peak[0]

    def show_sample(self, sample: DeviceSample) -> None:
        """Show one device reading (its panel appears on first sight)."""
        self._panel(sample.device, sample.name).update_sample(sample)

    def mark_shared_processes(self) -> None:
        """Panels whose devices are driven by one process say so (same pid, same figures)."""
        panels = list(self.query(DevicePanel))
        by_pid: dict[int, list[str]] = {}
        for panel in panels:
            if panel.last is not None and panel.last.pid is not None:
                by_pid.setdefault(panel.last.pid, []).append(panel.device)
        for panel in panels:
            pid = panel.last.pid if panel.last is not None else None
            group = by_pid.get(pid, []) if pid is not None else []
            panel.set_sharing(tuple(d for d in group if d != panel.device))

    def log_ui(self, message: str, level: str = "ui") -> None:
        """A remark of the app's own in the log pane."""
        self.query_one(RunLog).add(level, message)

    # ------------------------------------------------------------------ the record
    @work(thread=True, group="summary", exit_on_error=False)
    def load_summary(self) -> None:
        """Read the run record's summary off the UI thread."""
        run_dir = getattr(self.handle, "run_dir", None)
        if run_dir is None:
            return
        try:
            from gputui.core.runstore import read_summary

            summary = read_summary(run_dir)
        except Exception as exc:  # no summary (yet) is shown, not raised
            self.post_message(SummaryRead(self.run_id, None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(SummaryRead(self.run_id, summary))

    def on_summary_read(self, message: SummaryRead) -> None:
        """Show where the record is and what it says about the outcome."""
        run_dir = getattr(self.handle, "run_dir", "")
        summary = message.summary
        if summary is not None and summary.run_id:
            text = f"record {run_dir} · status {summary.status_text}"
        else:
            why = message.error or "no events on disk"
            text = f"record {run_dir} · no summary ({why}) · status {self.state}"
        self.query_one(RunStatus).set_record(text)

    # ------------------------------------------------------------------ state
    def watch_state(self, old: str, new: str) -> None:
        self.remove_class(f"-{old}")
        self.add_class(f"-{new}")
        if self.is_mounted:
            self.query_one(RunStatus).set_state(new)
            self.refresh_bindings()

    # ------------------------------------------------------------------ layout
    def on_resize(self) -> None:
        self._lay_out()

    @property
    def compact(self) -> bool:
        """Too small for every panel at once (under 160x45): the charts or the devices, one
        plot at a time beside the epoch table."""
        return self.app.size.width < FULL_SIZE[0] or self.app.size.height < FULL_SIZE[1]

    def _lay_out(self) -> None:
        self.set_class(self.compact, "-compact")
        self.set_class(self.show_devices, "-devices")
        plots = list(self.query(MetricPlot))
        for i, plot in enumerate(plots):
            plot.set_class(i == self.plot_index % len(plots), "-current")
        if self.compact:
            shown = plots[self.plot_index % len(plots)].title if plots else ""
            n = len(self.query(DevicePanel))
            views = (f"▸ Devices ({n})  ·  d: charts" if self.show_devices else
                     f"▸ {shown}  ·  p: next plot  ·  d: devices ({n})  ·  t: x axis")
            self.query_one("#run-views", Static).update(views)
        self.refresh_bindings()

    def watch_show_devices(self) -> None:
        if self.is_mounted:
            self._lay_out()

    def watch_plot_index(self) -> None:
        if self.is_mounted:
            self._lay_out()
            self.redraw_plots()

    def action_toggle_devices(self) -> None:
        """Compact layouts: the device panels in place of the charts, and back."""
        self.show_devices = not self.show_devices

    def action_next_plot(self) -> None:
        """Compact layouts: the next plot beside the epoch table."""
        self.plot_index = (self.plot_index + 1) % max(1, len(self.query(MetricPlot)))

    def action_time_axis(self) -> None:
        """The loss and throughput plots against elapsed time, or against steps."""
        self.time_axis = not self.time_axis

    def watch_time_axis(self, on: bool) -> None:
        t0 = self._started_ev.t if self._started_ev is not None else None
        for plot in (self.query_one(LossPlot), self.query_one(ThroughputPlot)):
            plot.set_time_axis(on, t0)
        if self.is_mounted:
            self.redraw_plots()
            self.notify("x axis: elapsed time" if on else "x axis: steps", timeout=2)

    # ------------------------------------------------------------------ controls
    def action_stop(self) -> None:
        """Graceful stop: the run ends at its next step and its record says 'stopped'."""
        if (self.ended or self.handle is None or self.state == "stopping"
                or self.read_only):
            return
        self.post_message(ControlRun("stop"))

    def action_kill(self) -> None:
        """Kill the training processes now (asks first)."""
        if self.ended or self.handle is None or self.read_only:
            return

        def answer(choice: str | None) -> None:
            if choice == "kill":
                self.post_message(ControlRun("kill"))

        self.app.push_screen(ChoiceDialog(
            "Kill the run?", "The training processes end at once; the record keeps what was "
            "logged so far. Stop (s) ends it cleanly instead.",
            [("kill", "Kill now", "error"), ("cancel", "Cancel", "default")],
            dialog_id="kill"), answer)

    def on_run_controlled(self, message: RunControlled) -> None:
        """A stop or kill was asked (by the user, the quit dialog, a signal): shown here."""
        if message.note:
            self.log_ui(message.note)
        if not self.ended:
            self.state = "stopping"

    def action_focus_log(self) -> None:
        self.query_one(RunLog).focus()

    def action_back(self) -> None:
        """Back to the set-up screen; an active run is never left behind unasked (a run
        watched read-only goes on where it runs: leaving it asks nothing)."""
        if self.ended or self.handle is None or self.read_only:
            self.app.pop_screen()
            return

        def answer(choice: str | None) -> None:
            if choice in ("stop", "kill"):
                self.post_message(ControlRun(choice))

        self.app.push_screen(ChoiceDialog(
            "The run is still active", "Leave it only once it has ended: stop it (the record "
            "is kept), kill it, or stay and watch.",
            [("stop", "Stop run", "warning"), ("kill", "Kill run", "error"),
             ("stay", "Stay", "default")], dialog_id="leave"), answer)
