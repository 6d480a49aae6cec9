"""The Textual app: set up a run, launch it, watch it, stop it.

The app owns the run's lifecycle (a :class:`~gputui.tui.run_control.RunController` per run it
launched, whose events and samples it pumps to the run screen), the sweep's, where screens go
and how a stop signal ends it (with :mod:`gputui.tui.lifecycle`); the screens post messages
to it (``StartRun``, ``SetupChanged``, ``ControlRun``, ``StartSweep``, ``OpenCompare``) and
it answers the run screen with ``RunControlled``: no screen calls the
app or another screen.

``make_app`` builds the app for the CLI and for tests alike (tests hand it a scripted
launcher and a fixed device inventory); ``run_tui`` is what ``gputui`` with no arguments runs.
Nothing here imports torch: the launcher is imported when the first run starts, and training
runs in its own processes.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import get_current_worker

from gputui.core.config import ConfigError, RunConfig, load_preset
from gputui.core.scores import score_text
from gputui.tui.defaults import app_default
from gputui.tui.inventory import Inventory, discover_inventory
from gputui.tui.lifecycle import KILL_WAIT_S, crash_line, detach_terminal, stop_then_kill
from gputui.tui.messages import (ControlRun, LaunchFailed, OpenCompare, RunControlled,
                                 RunEnded, RunLaunched, SetupChanged, StartRun, StartSweep,
                                 StopSweep, SweepStarted, UsePlannedRow, WatchRun)
from gputui.tui.pump import EventPump
from gputui.tui.run_control import STOP_NOTE, RunController
from gputui.tui.screens.dialogs import ChoiceDialog
from gputui.tui.screens.setup import SetupScreen
from gputui.tui.spawnsafe import private_terminal, ready_for_spawn

Launcher = Callable[..., Any]
CHILD_OUTPUT = "app-output.log"  # stray output of training processes started by the app
CRASH_LOG = "app-crash.log"  # the traceback of a crash (the terminal gets one line)
STOP_GRACE_S = 20.0  # quitting: how long a graceful stop may take before the run is killed
KILL_GRACE_S = 5.0  # after a kill: how long to wait for its terminal event before leaving
WARM_AFTER_PAINT_S = 0.3  # the warm host starts this long after the set-up is painted


class GpuTuiApp(App[int]):
    """gputui's app: the set-up screen first; a run screen per run on top of it."""

    CSS_PATH = "app.tcss"
    TITLE = "gputui"
    # size classes every screen gets (app.tcss lays the screens out by them; under 80x24,
    # widgets.too_small says so instead)
    HORIZONTAL_BREAKPOINTS = [(0, "-w-tiny"), (80, "-w-small"), (100, "-w-medium"),
                              (160, "-w-large")]
    VERTICAL_BREAKPOINTS = [(0, "-h-tiny"), (24, "-h-small"), (30, "-h-medium"),
                            (45, "-h-large")]
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "show_help_panel", "Keys", show=False),
        Binding("f6", "open_history", "History", show=False),
        Binding("f7", "open_sweep", "Sweep", show=False),
        Binding("f8", "open_plan", "Plan", show=False),
    ]

    def __init__(self, preset: str | Path | None = None, runs_dir: str | Path | None = None,
                 launcher: Launcher | None = None, *, inventory: Inventory | None = None,
                 presets: list[Path] | None = None,
                 discover: Callable[[], Inventory] | None = None,
                 warm_start: bool = False) -> None:
        super().__init__()
        self.warm_start = warm_start  # run_tui turns it on; a test asks for it explicitly
        self.preset_arg = preset
        self.runs_dir = runs_dir
        self._launcher = launcher
        self.fixed_inventory = inventory
        # how the set-up screen reads the machine's devices (a test may pass its own);
        # none with a fixed inventory, which is then all there is
        self.discover = discover or (None if inventory else discover_inventory)
        self.preset_list = presets
        self.run_control: RunController | None = None  # the run's lifecycle
        self.setup_config: RunConfig = RunConfig()  # the set-up screen's, as it last said
        self.launching = False
        self.quit_after_run = False
        self.quit_code = 0
        self.crash_log: Path | None = None
        self.sweep: Any = None  # the sweep in flight (a gputui.runs.sweep.runner.Sweep), or None
        self.stop_signal: int | None = None  # the first stop signal the app took

    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Notifications show their text as it is: a value or a message with square brackets
        (a TOML table name, a path) is never read as markup."""
        super().notify(message, title=title, severity=severity, timeout=timeout,
                       markup=markup)

    # ------------------------------------------------------------------ start-up
    def on_mount(self) -> None:
        self.install_stop_signals()
        config, preset_path, error = self._initial_config()
        self.setup_config = config
        setup = SetupScreen(
            config, preset=preset_path,
            inventory=self.fixed_inventory or Inventory(discovered=self.discover is None),
            discover=self.discover,
            presets=self.preset_list, runs_dir=self.runs_path)
        if self.is_headless:
            self._open_setup(setup, error)
        else:
            # In a terminal, after Textual's start-up: it paints nothing until its start-up
            # batch ends, and a screen pushed here was mounted inside that batch, so its first
            # frame was dropped and the first paint came a frame (and the form) later.
            self.call_later(self._open_setup, setup, error)

    def _open_setup(self, setup: SetupScreen, error: str) -> None:
        self.push_screen(setup)
        if error:
            self.notify(error, title="Preset not loaded", severity="error", timeout=12)

    def on_setup_shown(self) -> None:
        """The set-up screen is painted whole: the warm host may start. Not before: its start
        (a spawn, and the parent's imports of the host's side) and its import of torch
        competed with the first paint for the two cores and the GIL."""
        self.set_timer(WARM_AFTER_PAINT_S, self._warm_after_paint)

    def _warm_after_paint(self) -> None:
        # a run started before this (Ctrl+R at once) has its own host; the next warm one is
        # prepared when it ends (on_run_ended), not beside it
        if not self.run_active:
            self.prepare_warm_start(self.setup_config)

    def prepare_warm_start(self, config: RunConfig) -> None:
        """While the user is on the set-up screen, a training process loads torch (and, on
        GPUs, their CUDA context), so Start skips that (gputui.runs.warm). Only with the
        real launcher: a test's scripted launcher has no use for one."""
        if self._launcher is not None or not self.warm_start:
            return
        ready_for_spawn(self.runs_path / CHILD_OUTPUT)
        self._spawn_warm(config)

    @work(thread=True, exclusive=True, group="warm", exit_on_error=False)
    def _spawn_warm(self, config: RunConfig) -> None:
        from gputui.runs import warm

        warm.ensure_host(cuda=warm.cuda_indices(config.devices.spec))

    def _initial_config(self) -> tuple[RunConfig, Path | None, str]:
        """The preset given on the command line, or the app's default (one that learns within
        its first minute: gputui.tui.defaults), with the reason when the preset failed."""
        if not self.preset_arg:
            return app_default(), None, ""
        try:
            path = resolve_preset_path(self.preset_arg)
            return load_preset(path), path, ""
        except ConfigError as exc:
            return app_default(), None, str(exc)

    @property
    def runs_path(self) -> Path:
        """Where run records go: --runs-dir, $GPUTUI_RUNS_DIR or ./runs."""
        from gputui.core.runstore import default_runs_dir

        return Path(self.runs_dir) if self.runs_dir else default_runs_dir()

    @property
    def launcher(self) -> Launcher:
        """The launcher (imported lazily: gputui.runs.launcher.launch by default)."""
        if self._launcher is None:
            from gputui.runs.launcher import launch

            self._launcher = launch
        return self._launcher

    # ------------------------------------------------------------------ runs
    @property
    def run_active(self) -> bool:
        """A run is launching or has not reached its terminal event."""
        return self.launching or (self.run_control is not None and self.run_control.active)

    def on_start_run(self, message: StartRun) -> None:
        """The set-up screen's Start."""
        self.start_run(message.config)

    def on_setup_changed(self, message: SetupChanged) -> None:
        """The set-up screen's config as it last checked it (what a sweep starts from)."""
        self.setup_config = message.config

    def start_run(self, config: RunConfig) -> None:
        """Launch a run off the UI thread; its screen opens when the handle is back."""
        if self.run_active:
            self.notify("A run is already active: stop it first", severity="warning")
            return
        if self.sweep is not None:
            self.notify("A sweep is running: stop it first", severity="warning")
            return
        self.launching = True
        ready_for_spawn(self.runs_path / CHILD_OUTPUT)
        self.notify(f"Starting {config.strategy.name} on {config.devices.spec}…", timeout=3)
        self._launch(config)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False)
    def _launch(self, config: RunConfig) -> None:
        try:
            handle = self.launcher(config, self.runs_dir)
        except Exception as exc:  # a refused config, a missing dataset, a spawn failure
            self.post_message(LaunchFailed(str(exc) or type(exc).__name__))
            return
        self.post_message(RunLaunched(handle, config))

    async def on_run_launched(self, message: RunLaunched) -> None:
        """Open the run screen, then pump the run's events and samples to it."""
        from gputui.tui.screens.run import RunScreen

        self.launching = False
        screen = RunScreen(message.handle, message.config)
        run = self.run_control = RunController(
            message.handle, message.config,
            tell=lambda what, note: screen.post_message(RunControlled(what, note)),
            in_thread=lambda fn: self.run_worker(fn, thread=True, group="control",
                                                 exit_on_error=False),
            screen=screen)
        await self.push_screen(screen)  # mounted: the pump's first batch finds it attached
        self._pump(run)

    @work(thread=True, exclusive=True, group="pump", exit_on_error=False)
    def _pump(self, run: RunController) -> None:
        """Poll the run in a thread until its end is handed over (whether or not a screen
        still shows it), then tell the app."""
        worker = get_current_worker()
        pump = EventPump(run.handle, run.deliver, target_gone=run.screen_gone)
        pump.run(lambda: worker.is_cancelled)
        if pump.terminal_seen or pump.failed:
            self.post_message(RunEnded(run))

    def on_control_run(self, message: ControlRun) -> None:
        """Stop or Kill, from the run screen."""
        if self.run_control is None:
            return
        if message.what == "stop":
            self.run_control.stop(note=STOP_NOTE)
        elif message.what == "kill":
            self.run_control.kill()

    def on_launch_failed(self, message: LaunchFailed) -> None:
        """The run could not start: the reason, in the app."""
        self.launching = False
        self.notify(message.error, title="Run not started", severity="error", timeout=15)

    def on_run_ended(self, message: RunEnded) -> None:
        """A run ended: leave now if the user asked to quit when it did; else have a warm
        worker ready for the next run (the last one's, or a new one if it was killed)."""
        run = self.run_control
        if run is None or message.run is not run:
            return
        run.ended = True
        if self.quit_after_run:
            self.exit(self.quit_code, return_code=self.quit_code)
        else:
            self.prepare_warm_start(run.config)

    # ------------------------------------------------------------------ sweeps
    # The sweep screen plans one and posts ``StartSweep``; the app runs it (one at a time,
    # never beside a run) in a thread worker and tells the screen how it goes:
    # ``SweepStarted``, then ``PointChanged``/``PointProgress`` per point and ``SweepEnded``.
    # ``StopSweep`` stops the current run cleanly and starts no other; so does the app going
    # away.
    def on_start_sweep(self, message: StartSweep) -> None:
        """A sweep screen's Start: run the sweep unless a run or another sweep is active."""
        if self.run_active or self.sweep is not None:
            what = "A run is active" if self.run_active else "A sweep is running"
            self.notify(f"{what}: start the sweep when it has ended (or stop it)",
                        title="Cannot start the sweep", severity="warning")
            return
        from gputui.tui.spawnsafe import ready_for_spawn

        self.sweep = message.sweep
        ready_for_spawn(message.sweep.runs_dir / "app-output.log")
        message.screen.post_message(SweepStarted(message.sweep))
        self._run_sweep(message.sweep, message.screen)

    def on_stop_sweep(self, message: StopSweep) -> None:
        """Stop the current run cleanly and start no other."""
        self.stop_sweep()

    def stop_sweep(self) -> None:
        """Ask the sweep in flight to end (any thread); the app calls it when it goes away."""
        if self.sweep is not None:
            self.sweep.request_stop()

    @work(thread=True, exclusive=True, group="sweep", exit_on_error=False)
    def _run_sweep(self, sweep: Any, screen: Any) -> None:
        """The whole grid, off the UI thread; its news go to ``screen`` (dropped once it is
        gone), its end to the app as well."""
        from gputui.tui.screens.sweep import PointChanged, PointProgress, SweepEnded

        def on_event(point: Any, ev: Any) -> None:
            if ev.kind == "step":
                screen.post_message(PointProgress(point.key, f"epoch {ev.epoch} step "
                                                  f"{ev.step}/{ev.steps_per_epoch} loss "
                                                  f"{ev.loss:.4f}"))
            elif ev.kind == "epoch_end":
                screen.post_message(PointProgress(point.key, f"epoch {ev.epoch}/{ev.epochs}: "
                                                  + score_text(ev.task, ev.test_acc,
                                                               ev.val_loss)))
        state, error = "failed", ""
        try:
            state = sweep.run(lambda p: screen.post_message(PointChanged(p)), on_event)
        except Exception as exc:  # noqa: BLE001 - shown in the app, never a crash
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self.post_message(SweepEnded(state, error))
            screen.post_message(SweepEnded(state, error))

    def on_sweep_ended(self, message: Any) -> None:
        """The sweep in flight ended: another may start."""
        self.sweep = None

    # ------------------------------------------------------------------ where screens go
    # Screens never push another top-level screen themselves: they post a message and the
    # app opens it (a modal dialog is still pushed by the screen that asks its question).
    def on_open_compare(self, message: OpenCompare) -> None:
        """A screen asks for the comparison of some runs (one run: that run's plots)."""
        from gputui.tui.screens.compare import CompareScreen

        self.push_screen(CompareScreen(message.run_dirs, message.runs_dir,
                                       title=message.title,
                                       only_compared=message.only_compared))

    async def on_watch_run(self, message: WatchRun) -> None:
        """Follow a run started elsewhere on the run screen, from its record (read-only: the
        app's own run, if any, is untouched)."""
        from gputui.runs.follow import RecordFollower
        from gputui.tui.screens.run import RunScreen

        follower = RecordFollower(message.run_dir)
        screen = RunScreen(follower)
        await self.push_screen(screen)  # mounted: the pump's first batch finds it attached
        self.run_worker(lambda: self._follow(follower, screen), thread=True,
                        group="watch", exit_on_error=False)

    def _follow(self, follower: object, screen: Screen) -> None:
        """The pump of a followed record, until it ends or its screen is closed."""
        from textual.worker import get_current_worker

        from gputui.tui.pump import EventPump

        worker = get_current_worker()
        EventPump(follower, screen.post_message,
                  target_gone=lambda: not screen.is_attached).run(
            lambda: worker.is_cancelled or not screen.is_attached)

    def action_show_help_panel(self) -> None:
        """The keys (F1): the app's and the screen's first, the focused widget's after."""
        from textual.css.query import NoMatches

        from gputui.tui.keys import AppHelpPanel

        screen = self.screen
        try:
            screen.query_one(AppHelpPanel)
        except NoMatches:
            screen.mount(AppHelpPanel())

    def action_open_history(self) -> None:
        """The run history (F6): past runs with their plots, and comparisons."""
        from gputui.tui.screens.history import HistoryScreen

        self._go_to(HistoryScreen, lambda sid: HistoryScreen(self.runs_path, screen_id=sid))

    def action_open_sweep(self) -> None:
        """A sweep (F7) of the set-up's config over device counts x strategies (it starts
        only when no run is active)."""
        from gputui.core import registry
        from gputui.tui.screens.sweep import SweepScreen

        config = self.setup_config
        self._go_to(SweepScreen, lambda sid: SweepScreen(config, self.runs_path,
                                                         registry.names(), screen_id=sid))

    def action_open_plan(self) -> None:
        """The plan (F8) of the set-up's GPT on devices this machine does not have: memory
        per rank, the fit and the speed of every mesh (`gputui plan`'s planner)."""
        from gputui.tui.screens.plan import PlanScreen

        config = self.setup_config
        out = self.runs_path / CHILD_OUTPUT
        self._go_to(PlanScreen, lambda sid: PlanScreen(config, child_output=out,
                                                       runs_dir=self.runs_path,
                                                       screen_id=sid))

    def on_use_planned_row(self, message: UsePlannedRow) -> None:
        """A planned row into the set-up form: back to the set-up, with the row's config."""
        stack = self.screen_stack
        setup = next((s for s in stack if isinstance(s, SetupScreen)), None)
        if setup is None or not all(self._closable(s) for s in stack[stack.index(setup) + 1:]):
            self.notify("A run or a sweep is active above the set-up: stop it first",
                        severity="warning")
            return
        while self.screen is not setup:
            self.pop_screen()
        setup.show_config(message.config, message.label)

    def _go_to(self, cls: type, make: Callable[[str], Screen]) -> None:
        """Bring a screen of ``cls`` to the top from anywhere: back to the one in the stack
        when only screens that can close safely lie above it, else a new one on top (with
        an id of its own: two screens never share one)."""
        stack = self.screen_stack
        if isinstance(self.screen, cls):
            return
        found = [i for i, s in enumerate(stack) if isinstance(s, cls)]
        if found and all(self._closable(s) for s in stack[found[-1] + 1:]):
            for _ in stack[found[-1] + 1:]:
                self.pop_screen()
            return
        sid = cls.__name__.removesuffix("Screen").lower()
        taken = {s.id for s in stack}
        n = 1
        while (sid if n == 1 else f"{sid}-{n}") in taken:
            n += 1
        self.push_screen(make(sid if n == 1 else f"{sid}-{n}"))

    @staticmethod
    def _closable(screen: Screen) -> bool:
        """A screen that can be closed to go back: nothing runs or waits in it."""
        from gputui.tui.screens.compare import CompareScreen
        from gputui.tui.screens.history import HistoryScreen
        from gputui.tui.screens.plan import PlanScreen
        from gputui.tui.screens.run import RunScreen
        from gputui.tui.screens.sweep import SweepScreen

        if isinstance(screen, SweepScreen):
            return not screen.running
        if isinstance(screen, RunScreen):
            return screen.ended
        if isinstance(screen, PlanScreen):
            return not screen.planning
        return isinstance(screen, (HistoryScreen, CompareScreen))

    # ------------------------------------------------------------------ command palette
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The main actions of the current screen, then Textual's own commands."""
        from gputui.tui.palette import screen_commands

        yield from screen_commands(screen)
        yield SystemCommand("Run history", "Past runs, their plots, comparisons (f6)",
                            self.action_open_history)
        yield SystemCommand("Sweep", "The set-up over device counts x strategies (f7)",
                            self.action_open_sweep)
        yield SystemCommand("Plan", "Will the set-up's GPT fit, and how fast, on GPUs you do "
                            "not have (f8)", self.action_open_plan)
        yield from super().get_system_commands(screen)

    # ------------------------------------------------------------------ stop signals
    # A stop signal (SIGINT, SIGTERM, SIGHUP) stops the active run gracefully and the app
    # leaves when it has ended (128 + the signal); a second one, or a stop that outlasts
    # run.stop_grace_s, kills it (gputui.tui.lifecycle).
    def install_stop_signals(self) -> None:
        """Take SIGINT, SIGTERM and SIGHUP in the app's event loop (main thread only)."""
        import asyncio

        from gputui.core.signals import STOP_SIGNALS

        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, self.on_stop_signal, sig)
            except (ValueError, RuntimeError, NotImplementedError):
                return  # not the main thread (a test's app): the signals stay as they were
        # one that came between the command line's handlers and these (the command line
        # notes them for the app): acted on once the first screen is up
        from gputui.core.signals import NOTED_FOR_APP

        if NOTED_FOR_APP:
            first = NOTED_FOR_APP[0]
            NOTED_FOR_APP.clear()
            self.call_after_refresh(self.on_stop_signal, first)

    def on_stop_signal(self, signum: int) -> None:
        """First signal: stop the run (or leave at once without one); then: kill it."""
        from gputui.core.signals import describe, stop_reason

        if signum == signal.SIGHUP:
            self._hang_up()
            return
        first = self.stop_signal is None
        stop_signal = signum if self.stop_signal is None else self.stop_signal
        self.stop_signal = stop_signal
        code = 128 + stop_signal
        run = self.run_control
        if not self.run_active or run is None or run.handle is None:
            self.exit(code, return_code=code)
            return
        self.quit_after_run, self.quit_code = True, code
        if first:
            run.stop(stop_reason(signum), note=f"{describe(signum)}: stopping the run, then "
                                               f"quitting")
            grace = getattr(getattr(run.config, "run", None), "stop_grace_s", 30.0)
            self.set_timer(grace, lambda: self._kill_after_signal(run, f"the stop asked by "
                                                          f"{describe(signum)} did not end "
                                                          f"within {grace:g} s"))
        else:
            self._kill_after_signal(run, f"a second signal ({describe(signum)})")

    def _hang_up(self) -> None:
        """The terminal is gone: nothing can be drawn, and Textual's own teardown would wait
        on it. Stop the run gracefully (kill it after its grace period) in a thread, then
        leave at once with 128 + SIGHUP."""
        detach_terminal()
        self.stop_signal = self.stop_signal or signal.SIGHUP
        handle = self.stop_orphans()
        reason = self.exit_reason()

        def leave() -> None:
            if handle is not None:
                cfg = getattr(handle, "cfg", None)
                stop_then_kill(handle, reason, cfg.run.stop_grace_s if cfg is not None else 30.0)
            os._exit(128 + signal.SIGHUP)

        threading.Thread(target=leave, name="gputui-hangup", daemon=True).start()

    def _kill_after_signal(self, run: Any, why: str) -> None:
        if not run.active:
            return
        run.kill(f"killed: {why}", note=f"{why}: killing the run")
        code = self.quit_code
        self.set_timer(KILL_WAIT_S, lambda: self.exit(code, return_code=code))

    # ------------------------------------------------------------------ quitting
    quitting = False  # exit() was called: screens leave the widgets that go with the app

    def exit(self, result: Any = None, return_code: int = 0,
             message: Any = None) -> None:
        """Textual's exit, remembered (``quitting``) for what must not touch a closing app."""
        self.quitting = True
        super().exit(result, return_code, message)

    async def action_quit(self) -> None:
        """Quit; with a run active, ask first (stop and quit, kill and quit, or cancel)."""
        run = self.run_control
        if not self.run_active or run is None:
            self.exit(0)
            return

        def answer(choice: str | None) -> None:
            if choice == "stop":
                self.quit_after_run = True
                run.stop(note=STOP_NOTE)
                self.set_timer(STOP_GRACE_S, lambda: self._escalate(run))
            elif choice == "kill":
                self.quit_after_run = True
                run.kill()
                self.set_timer(KILL_GRACE_S, lambda: self.exit(0))

        self.push_screen(ChoiceDialog(
            "A run is active", "Quitting never leaves a run behind. Stop it cleanly and quit "
            "when it has stopped (the record is kept), kill it and quit, or stay.",
            [("stop", "Stop run, then quit", "warning"), ("kill", "Kill run and quit", "error"),
             ("cancel", "Cancel", "default")], dialog_id="quit"), answer)

    def _escalate(self, run: RunController) -> None:
        if run.active:
            run.kill(note=f"the run did not stop within {STOP_GRACE_S:.0f} s: killing it")
            self.set_timer(KILL_GRACE_S, lambda: self.exit(0))

    def exit_reason(self) -> str:
        """Why the app is going away with a run active: the record's stop reason."""
        if self._exception is not None:
            return f"stopped: {crash_line(self._exception).removeprefix('gputui: error: ')}"
        if self.stop_signal is not None:
            from gputui.core.signals import stop_reason

            return stop_reason(self.stop_signal)
        return "stopped: the app exited"

    def stop_orphans(self) -> Any:
        """The app goes away anyway: ask the active run to stop (no training process outlives
        the app); returns its handle, for ``run_tui`` to wait for (or None)."""
        run = self.run_control
        if run is None or not run.active:
            return None
        try:
            run.handle.stop(self.exit_reason())  # here, not in a worker: the app is leaving
        except Exception:  # the app is exiting: nothing left to tell
            pass
        return run.handle

    def on_unmount(self) -> None:
        self.stop_sweep()  # start no further run of a sweep
        self.stop_orphans()

    def _print_error_renderables(self) -> None:
        """A crash: the traceback goes to runs/app-crash.log, the terminal gets one line
        (printed by ``run_tui``)."""
        if not self._exit_renderables:
            return
        from rich.console import Console

        try:
            self.runs_path.mkdir(parents=True, exist_ok=True)
            path = self.runs_path / CRASH_LOG
            with open(path, "a", encoding="utf-8") as fh:
                console = Console(file=fh, width=120, color_system=None)
                for renderable in self._exit_renderables:
                    console.print(renderable)
            self.crash_log = path
        except OSError:
            super()._print_error_renderables()
        self._exit_renderables.clear()

def resolve_preset_path(name_or_path: str | Path) -> Path:
    """A preset name or path -> its file, exactly as `gputui run` resolves it."""
    from gputui.core.presets import resolve_preset

    return Path(resolve_preset(str(name_or_path)))


def make_app(preset: str | Path | None = None, runs_dir: str | Path | None = None,
             launcher: Launcher | None = None, **kwargs: Any) -> GpuTuiApp:
    """The app, as the CLI and the tests build it (kwargs: inventory=, presets=, discover=)."""
    return GpuTuiApp(preset, runs_dir, launcher, **kwargs)


def run_tui(preset: str | Path | None = None, runs_dir: str | Path | None = None) -> int:
    """Run the app in this terminal; returns the exit code for the CLI.

    Training processes inherit fds 1 and 2: their stray output goes to
    ``<runs dir>/app-output.log`` instead of over the screen.
    """
    import sys

    app = make_app(preset, runs_dir, warm_start=True)
    with private_terminal():
        try:
            app.run()
        finally:
            handle = app.stop_orphans()
            if handle is not None:
                cfg = getattr(handle, "cfg", None)
                stop_then_kill(handle, app.exit_reason(),
                               cfg.run.stop_grace_s if cfg is not None else STOP_GRACE_S)
    if app._exception is not None or app.return_code == 1:
        where = f" (the traceback is in {app.crash_log})" if app.crash_log else ""
        print(f"{crash_line(app._exception)}{where}", file=sys.stderr)
        return 1
    return int(app.return_code or 0)
