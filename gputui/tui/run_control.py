"""The lifecycle of the app's run, in one place: launched, pumped, stopping, ended.

The app owns one :class:`RunController` per run it launched, and pumps the run's two streams
(events, samples: :mod:`gputui.tui.pump`) in a thread worker of its own, whose messages
:meth:`RunController.deliver` hands to the run screen showing the run. The run screen only
shows what it is told: it posts ``ControlRun`` when the user presses Stop or Kill and is told
with ``RunControlled`` that a stop or kill was asked (whoever asked: the user, the quit
dialog, a signal, the app crashing). Requests go to the run's handle off the UI thread, since
stopping or killing may signal processes. The run is watched to its end whether or not a
screen shows it (its record is the host's, on disk, either way).
"""

from __future__ import annotations

from typing import Any, Callable

STOP_NOTE = "stop requested: the run stops at its next step and keeps its record"


class RunController:
    """One run's handle and config, whether a stop or kill was asked, and whether it ended."""

    def __init__(self, handle: Any, config: Any, tell: Callable[[str, str], object],
                 in_thread: Callable[[Callable[[], None]], Any],
                 screen: Any = None) -> None:
        self.handle = handle
        self.config = config
        # the run screen the pump's messages go to; read by the pump's thread, which only
        # posts to it (Textual's post_message is thread-safe) and asks whether it is attached
        self.screen = screen
        self.ended = False  # the pump handed over the terminal event, or lost the run
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

    def deliver(self, message: Any) -> bool:
        """The pump's ``post`` (its thread): to the run screen while one shows the run; with
        none, the message is acknowledged here, so the run is still pumped to its end."""
        if self.screen is not None and self.screen.post_message(message):
            return True
        ack = getattr(message, "ack", None)
        if ack is not None:
            ack()
        return True

    def screen_gone(self) -> bool:
        """The run screen was closed (a batch it held will never be acknowledged)."""
        return self.screen is None or not self.screen.is_attached

    def _send(self, what: str, *args: str) -> None:
        """stop()/kill() may signal processes and wait: never on the UI thread."""
        self._in_thread(lambda: getattr(self.handle, what)(*args))
