"""The one writer of a run's record: ``events.jsonl`` and ``summary.json``.

The run host (``host.py``) records every event of its run through :class:`Recorder`: its own,
and those its ranks send it; each is forwarded to the parent's queue after it is on disk, and
the host closes the record at the end. The recorder knows what it wrote (``terminal``,
``ended``): nothing reads the record back to decide what to do. The one other entry is
:func:`end_after_host`: the parent ends the record of a host that died without ending it.

Each event is one whole line or none (``runstore.EventLog`` over ``filewrite.AppendLog``).
The terminal event is written in the space the run set aside (``runstore.reserve_space``), so
it fits on a full disk. ``summary.json`` is written when the record is closed; its presence
marks a closed record (``history._stale``). A summary that cannot be written is rebuilt from
the events by ``runstore.read_summary``. Torch-free: the parent uses it too.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from gputui.core.events import Event, is_terminal
from gputui.core.filewrite import WriteFailed, write_atomic
from gputui.core.runstore import (EventLog, RunSummary, read_events, release_space,
                                   summarize)

EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"


class Recorder:
    """Writes each event to events.jsonl (one whole line, written before it is passed on) and
    hands it to ``forward`` (a queue's ``put``). A failed write of an event raises WriteFailed,
    which ends the run; the terminal event uses the space the run set aside, and when even
    that fails it still reaches ``forward``, whose receiver ends the record (``ended`` False).
    Thread-safe: a host records its ranks' events from a thread and its own from another."""

    def __init__(self, run_dir: str | Path, forward: Callable[[Event], Any] | None = None,
                 written: Iterable[Event] = ()):
        self.run_dir = Path(run_dir)
        self.log = EventLog(self.run_dir / EVENTS_FILE)  # WriteFailed when it cannot be opened
        self.forward = forward
        self.events: list[Event] = list(written)  # the record so far (``written``: on disk)
        self.terminal: Event | None = None  # the terminal event emitted, once there is one
        self.ended = False  # that terminal event is on disk
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """RunStarted has been recorded."""
        return any(e.kind == "run_started" for e in self.events)

    def emit(self, event: Event) -> None:
        """Record ``event``, then forward it. The terminal event is the record's last: nothing
        after it is recorded (a second end, or a rank's start that raced the host's end of a
        run stopped before its ranks started)."""
        self._emit(event, None)

    def end_unless_started(self, event: Event) -> bool:
        """Record the terminal ``event`` if RunStarted is not recorded, as one step against
        the ranks' own events (a stop before the ranks started: their RunStarted, arriving
        meanwhile, either comes first and this is not recorded, or comes after and is not).
        True when it was recorded."""
        return self._emit(event, lambda: not self.started)

    def _emit(self, event: Event, unless: Callable[[], bool] | None) -> bool:
        with self._lock:
            if self.terminal is not None or (unless is not None and not unless()):
                return False
            if is_terminal(event):
                self.terminal = event
                self.ended = self.end(event)  # kept in the summary even when refused
            else:
                self.log.write(event)
            self.events.append(event)
        if self.forward is not None:
            try:
                self.forward(event)
            except Exception:  # noqa: BLE001 - a gone listener must not stop the record
                self.forward = None
        return True

    def end(self, event: Event) -> bool:
        """Append the terminal ``event`` in the space set aside; False when even that failed
        (the record is left whole, without it)."""
        release_space(self.run_dir)
        try:
            self.log.write(event)
        except WriteFailed:
            return False
        return True

    def close(self, summary: bool = True) -> None:
        """Close the log; with ``summary``, first write summary.json (skipped on a full disk:
        it is rebuilt from the events)."""
        if summary:
            release_space(self.run_dir)
            try:
                write_summary(self.run_dir, summarize(self.events))
            except WriteFailed:
                pass
        self.log.close()


def end_after_host(run_dir: str | Path, event: Event) -> bool:
    """The parent's fallback: end the record of a host that died without ending it (or whose
    terminal write failed) with ``event`` and close it (summary.json, from the events on disk:
    the host is gone, nothing else writes there). Never raises: True when the event is on
    disk. The space set aside is released either way."""
    try:  # the summary written with a terminal event needs the rest of the record
        recorder = Recorder(run_dir, written=read_events(run_dir))
    except OSError:  # WriteFailed included
        release_space(run_dir)
        return False
    written = recorder.end(event)
    if written:
        recorder.events.append(event)
    recorder.close(summary=written)
    return written


def write_summary(run_dir: str | Path, summary: RunSummary) -> None:
    """Write summary.json atomically (a reader never sees half a file)."""
    write_atomic(Path(run_dir) / SUMMARY_FILE,
                 json.dumps(summary.to_dict(), indent=2, sort_keys=True) + "\n")
