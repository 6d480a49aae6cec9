"""The one writer of a run's record: ``events.jsonl`` and ``summary.json``.

Every process that writes a record does it through :class:`Recorder`:

- the training process (``worker.child_main``, a warm worker's run, or local rank 0 of a
  ddp/fsdp run) streams the run's events, each forwarded to the parent's queue after it is
  on disk, and closes the record at the end;
- the elastic agent (``agent.py``) adds its own lines and, when the ranks ended without one,
  the terminal event naming the root cause (:func:`add`);
- the parent (``launcher.RunHandle``) adds the terminal event of a child that died without
  one, or one that reached its queue but not the disk (:func:`add`).

Each event is one whole line or none (``runstore.EventLog`` over ``filewrite.AppendLog``).
The terminal event is written in the space the run set aside (``runstore.reserve_space``), so
it fits on a full disk. ``summary.json`` is written when a writer closes the record: the
summary of the record as that writer knows it (the events it wrote; one that adds only the end
reads the others from disk first). Its presence marks a closed record (``history._stale``). A
summary that cannot be written is rebuilt from the events by ``runstore.read_summary``.
Torch-free: the parent uses it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

from gputui.core.events import Event, is_terminal
from gputui.core.filewrite import WriteFailed, write_atomic
from gputui.core.runstore import EventLog, read_events, release_space, summarize

EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"


class Recorder:
    """Writes each event to events.jsonl (one whole line, written before it is passed on) and
    hands it to ``forward`` (a queue's ``put``). A failed write of an event raises WriteFailed,
    which ends the run; the terminal event uses the space the run set aside, and when even
    that fails it still reaches ``forward``, whose receiver ends the record."""

    def __init__(self, run_dir: str | Path, forward: Callable[[Event], Any] | None = None,
                 written: Iterable[Event] = ()):
        self.run_dir = Path(run_dir)
        self.log = EventLog(self.run_dir / EVENTS_FILE)  # WriteFailed when it cannot be opened
        self.forward = forward
        self.events: list[Event] = list(written)  # the record so far (``written``: on disk)

    def emit(self, event: Event) -> None:
        """Record ``event``, then forward it."""
        if is_terminal(event):
            self.end(event)  # kept in the summary even when the disk refused it
        else:
            self.log.write(event)
        self.events.append(event)
        if self.forward is not None:
            try:
                self.forward(event)
            except Exception:  # noqa: BLE001 - a gone listener must not stop the record
                self.forward = None

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


def add(run_dir: str | Path, event: Event,
        forward: Callable[[Event], Any] | None = None) -> bool:
    """Add one ``event`` to a record this process does not hold open; a terminal event also
    closes the record (summary.json). Never raises: True when the event is on disk.
    ``forward`` gets the event either way (the receiver may still record it)."""
    written, terminal = False, is_terminal(event)
    try:  # the summary written with a terminal event needs the rest of the record
        recorder = Recorder(run_dir, written=read_events(run_dir) if terminal else ())
    except OSError:  # WriteFailed included: the receiver of ``forward`` may end the record
        recorder = None
    if recorder is not None:
        try:
            if terminal:
                written = recorder.end(event)
            else:
                recorder.log.write(event)
                written = True
        except WriteFailed:  # a full disk: the receiver of ``forward`` may end the record
            pass
        if written:
            recorder.events.append(event)
        recorder.close(summary=terminal and written)
    if forward is not None:
        try:
            forward(event)
        except (OSError, ValueError):  # the receiver is gone; the record has it (or not)
            pass
    return written


def end_if_open(run_dir: str | Path, event: Event) -> None:
    """Add the terminal ``event`` unless the record already ends; the space set aside is
    released either way (nothing more will be written)."""
    try:
        if not any(is_terminal(e) for e in read_events(run_dir)):
            add(run_dir, event)
    except OSError:  # unreadable: nothing more can be written there
        pass
    release_space(run_dir)


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> None:
    """Write summary.json atomically (a reader never sees half a file)."""
    write_atomic(Path(run_dir) / SUMMARY_FILE,
                 json.dumps(summary, indent=2, sort_keys=True) + "\n")
