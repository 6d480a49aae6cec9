"""Where the app's screens go: history (F6), sweep (F7), plan (F8), a comparison asked for by a
screen (``OpenCompare``), a run started elsewhere followed on the run screen (``WatchRun``),
and the command palette's entries.

Screens never push another top-level screen themselves: they post a message and the app
opens it (a modal dialog is still pushed by the screen that asks its question).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from textual.app import SystemCommand
from textual.screen import Screen

from gputui.tui.messages import OpenCompare, UsePlannedRow, WatchRun

if TYPE_CHECKING:  # what the mixin is checked against; at run time the app brings App
    from textual.app import App

    from gputui.core.config import RunConfig

    _Base = App[int]
else:
    _Base = object


class Navigation(_Base):
    """Mixed into the app, which provides ``runs_path`` and ``setup_config``."""

    if TYPE_CHECKING:
        setup_config: RunConfig

        @property
        def runs_path(self) -> Path: ...

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
        out = self.runs_path / "app-output.log"  # the app's CHILD_OUTPUT
        self._go_to(PlanScreen, lambda sid: PlanScreen(config, child_output=out,
                                                       screen_id=sid))

    def on_use_planned_row(self, message: UsePlannedRow) -> None:
        """A planned row into the set-up form: back to the set-up, with the row's config."""
        from gputui.tui.screens.setup import SetupScreen

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
        from gputui.tui.screens.run import RunScreen
        from gputui.tui.screens.sweep import SweepScreen

        if isinstance(screen, SweepScreen):
            return not screen.running
        if isinstance(screen, RunScreen):
            return screen.ended
        from gputui.tui.screens.plan import PlanScreen

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
