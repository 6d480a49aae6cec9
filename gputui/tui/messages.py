"""Messages that thread workers post to the UI thread.

Only frozen snapshots travel in them (events are frozen dataclasses, carried in tuples).
The high-rate ones define ``can_replace`` so a stale message queued behind a newer one of the
same kind is dropped rather than handled (Textual checks it against the next queued message).
"""

from __future__ import annotations

from typing import Any, Callable

from textual.message import Message

from gputui.core.events import DeviceSample, Event
from gputui.core.runstore import RunSummary


class RunEventBatch(Message):
    """Everything but device samples that one poll (or several, while the UI was busy) returned.

    The pump sends the next batch only after ``ack`` is called, so at most one batch is ever
    queued: a burst of thousands of events becomes a few large batches, not thousands of
    messages.
    """

    def __init__(self, run_id: str, events: tuple[Event, ...], dropped_logs: int = 0,
                 ack: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.events = events
        self.dropped_logs = dropped_logs
        self._ack = ack

    def ack(self) -> None:
        """Tell the pump this batch is handled and the next may come."""
        if self._ack is not None:
            self._ack()
            self._ack = None


class DeviceSamples(Message):
    """The latest telemetry reading of every device seen so far (latest wins)."""

    def __init__(self, run_id: str, samples: tuple[DeviceSample, ...],
                 ack: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.samples = samples
        self._ack = ack

    def ack(self) -> None:
        """Tell the pump these samples are shown."""
        if self._ack is not None:
            self._ack()
            self._ack = None

    def can_replace(self, message: Message) -> bool:
        # The next queued DeviceSamples holds every device's latest reading: this one is stale.
        return isinstance(message, DeviceSamples) and message.run_id == self.run_id


class PumpFailed(Message):
    """Polling the run raised: the run can no longer be watched (the error, one line)."""

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.error = error


class RunLaunched(Message):
    """The launcher returned a handle: the run exists and its child process is starting."""

    def __init__(self, handle: Any, config: Any) -> None:
        super().__init__()
        self.handle = handle
        self.config = config


class LaunchFailed(Message):
    """The launcher refused or raised before the run existed (the error, one line)."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class InventoryReady(Message):
    """A fresh device inventory for the set-up table (rows and the no-GPU sentence)."""

    def __init__(self, inventory: Any) -> None:
        super().__init__()
        self.inventory = inventory

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, InventoryReady)


class FilesChecked(Message):
    """What the disk said of the files a form's config names (``key`` says which config's
    files: see ``SetupScreen``), as one line, or None when all is there."""

    def __init__(self, key: str, problem: str | None) -> None:
        super().__init__()
        self.key = key
        self.problem = problem


class HistoryRead(Message):
    """The run history's rows, read off the UI thread (for the set-up's estimate)."""

    def __init__(self, rows: tuple) -> None:
        super().__init__()
        self.rows = rows


class SummaryRead(Message):
    """The run record's summary, read after the run ended (None when it has none)."""

    def __init__(self, run_id: str, summary: RunSummary | None, error: str = "") -> None:
        super().__init__()
        self.run_id = run_id
        self.summary = summary
        self.error = error


class RunEnded(Message):
    """The app's pump handed over the run's terminal event, or lost the run (``run``: its
    ``RunController``)."""

    def __init__(self, run: Any) -> None:
        super().__init__()
        self.run = run


# ---------------------------------------------------------------- screens -> app, app -> screens
# Screens never call the app or another screen: they post these, and the app (the owner of
# the run's lifecycle, through gputui.tui.run_control) answers.

class SetupShown(Message):
    """The set-up screen is painted whole (its form's rows in): what waited for that (the
    warm host) may start."""


class StartRun(Message):
    """The set-up screen asks for a run of ``config`` (already checked)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config


class SetupChanged(Message):
    """The set-up screen's config after its last check (None while it is not valid)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config


class ControlRun(Message):
    """The run screen asks to "stop" (gracefully) or "kill" the run it shows."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what


class RunControlled(Message):
    """The app asked the run to stop or be killed: the run screen shows it as stopping, with
    ``note`` in its log ("" for none)."""

    bubble = False  # for the run screen alone

    def __init__(self, what: str, note: str = "") -> None:
        super().__init__()
        self.what, self.note = what, note


class OpenCompare(Message):
    """A screen asks for the comparison of ``run_dirs`` (one run: that run with its plots;
    ``only_compared``: a sweep's runs, whose baselines come from the sweep alone)."""

    def __init__(self, run_dirs: list[Any], runs_dir: Any, title: str = "",
                 only_compared: bool = False) -> None:
        super().__init__()
        self.run_dirs, self.runs_dir, self.title = list(run_dirs), runs_dir, title
        self.only_compared = only_compared


class WatchRun(Message):
    """A screen asks to follow a run started elsewhere (``run_dir``), live and read-only, on
    the run screen (History: a run still running)."""

    def __init__(self, run_dir: Any) -> None:
        super().__init__()
        self.run_dir = run_dir


class StartSweep(Message):
    """The sweep screen asks the app to run ``sweep`` (planned, not started); the app answers
    the screen (``screen``) with ``SweepStarted`` and the sweep's progress, or says why not."""

    def __init__(self, sweep: Any, screen: Any) -> None:
        super().__init__()
        self.sweep, self.screen = sweep, screen


class SweepStarted(Message):
    """The app runs ``sweep``, which the screen asked for."""

    bubble = False  # for the sweep screen alone

    def __init__(self, sweep: Any) -> None:
        super().__init__()
        self.sweep = sweep


class StopSweep(Message):
    """The sweep screen asks to stop the sweep: the current run stops cleanly, no other
    starts."""


class UsePlannedRow(Message):
    """The plan screen asks the app to load a planned row's config into the set-up form
    (``label``: how the set-up names it)."""

    def __init__(self, config: Any, label: str) -> None:
        super().__init__()
        self.config, self.label = config, label
