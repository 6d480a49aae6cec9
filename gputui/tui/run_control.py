"""The lifecycle of the app's run, in one place: launched, stopping, ended.

The app owns one :class:`RunController` per run it launched. The run screen only shows the
run: it posts ``ControlRun`` when the user presses Stop or Kill and is told with
``RunControlled`` that a stop or kill was asked (whoever asked: the user, the quit dialog, a
signal, the app crashing). Requests go to the run's handle off the UI thread, since stopping
or killing may signal processes.
"""

from __future__ import annotations

from typing import Any, Callable

STOP_NOTE = "stop requested: the run stops at its next step and keeps its record"


class RunController:
    """One run's handle and config, whether a stop or kill was asked, and whether it ended."""

    def __init__(self, handle: Any, config: Any, tell: Callable[[str, str], object],
                 in_thread: Callable[[Callable[[], None]], Any]) -> None:
        self.handle = handle
        self.config = config
        self.ended = False  # the run's terminal event was seen (set by the app)
        self.stopping = False  # a graceful stop was asked
        self.killed = False  # a kill was asked
        self._tell = tell  # (what, note): the run screen shows it
        self._in_thread = in_thread  # runs a request off the UI thread (a thread worker)

    @property
    def active(self) -> bool:
        """The run has not ended."""
        return not self.ended and self.handle is not None

    def stop(self, reason: str | None = None, note: str = "") -> bool:
        """A graceful stop: the run ends at its next step; ``reason`` is what its record says
        (None: the handle's own words, asked once; a reason, e.g. a signal, is always sent).
        False when there is nothing to stop."""
        if not self.active or self.killed or (self.stopping and reason is None):
            return False
        self.stopping = True
        self._tell("stop", note)
        self._send("stop", *([reason] if reason is not None else []))
        return True

    def kill(self, reason: str = "killed by user", note: str = "kill requested") -> bool:
        """End the training processes now. False when there is nothing to kill."""
        if not self.active or self.killed:
            return False
        self.killed = True
        self._tell("kill", note)
        self._send("kill", reason)
        return True

    def _send(self, what: str, *args: str) -> None:
        """stop()/kill() may signal processes and wait: never on the UI thread."""
        self._in_thread(lambda: getattr(self.handle, what)(*args))
