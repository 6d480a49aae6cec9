"""The app's sweep: the sweep screen plans one and posts ``StartSweep``; the app runs it (one
at a time, never beside a run) in a thread worker and tells the screen how it goes.

The screen never reads the app's state nor runs the grid itself: it is told ``SweepStarted``,
then ``PointChanged``/``PointProgress`` per point and ``SweepEnded``, or, when a run is
active, the app says why it cannot start. ``StopSweep`` stops the current run cleanly and
starts no other; so does the app going away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import work

from gputui.core.scores import score_text
from gputui.tui.messages import StartSweep, StopSweep, SweepStarted

if TYPE_CHECKING:  # what the mixin is checked against; at run time the app brings App
    from textual.app import App

    _Base = App[int]
else:
    _Base = object


class SweepOwner(_Base):
    """Mixed into the app, which provides ``run_active`` and ``runs_path``."""

    sweep: Any = None  # the sweep in flight (a gputui.runs.sweep.runner.Sweep), None between sweeps

    if TYPE_CHECKING:
        @property
        def run_active(self) -> bool: ...

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
