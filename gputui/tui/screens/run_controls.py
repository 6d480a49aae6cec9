"""The run screen's controls: Stop (graceful), Kill (asks first), leaving (never orphans).

The screen does not stop or kill the run itself: it posts ``ControlRun`` to the app, which
owns the run's lifecycle (``gputui.tui.run_control``), and shows the run as stopping when the
app answers with ``RunControlled``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gputui.tui.messages import ControlRun, RunControlled
from gputui.tui.screens.dialogs import ChoiceDialog
from gputui.tui.widgets.run_log import RunLog

if TYPE_CHECKING:  # what the mixin is checked against; at run time RunScreen brings Screen
    from textual.screen import Screen

    _Base = Screen
else:
    _Base = object


class RunControls(_Base):
    """Mixed into RunScreen, which provides ``handle``, ``state``, ``ended`` and ``log_ui``."""

    if TYPE_CHECKING:
        handle: Any
        state: str

        @property
        def ended(self) -> bool: ...

        def log_ui(self, message: str, level: str = "ui") -> None: ...

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("stop", "kill") and (self.ended or self.handle is None
                                           or getattr(self, "read_only", False)):
            return False  # not offered: nothing left to stop, or a run watched read-only
        return True

    def action_stop(self) -> None:
        """Graceful stop: the run ends at its next step and its record says 'stopped'."""
        if (self.ended or self.handle is None or self.state == "stopping"
                or getattr(self, "read_only", False)):
            return
        self.post_message(ControlRun("stop"))

    def action_kill(self) -> None:
        """Kill the training processes now (asks first)."""
        if self.ended or self.handle is None or getattr(self, "read_only", False):
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
        if self.ended or self.handle is None or getattr(self, "read_only", False):
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
