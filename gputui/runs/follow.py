"""Follow a run started elsewhere from its record as it grows: ``gputui watch RUN`` and the
app's History (a run still running opens on the run screen, live).

:class:`RecordFollower` reads ``events.jsonl`` and ``telemetry.jsonl`` from where it left
off, whole lines only (a line being written is read once it ends), and offers the two
streams a :class:`~gputui.runs.launcher.RunHandle` offers (``poll``, ``samples``), so the
headless printer and the run screen's pump take it as they take a run of their own. It
never writes to the record: files are opened read-only, the lock only tested.

Whether the run still runs is the record's and its lock's to say (``runlock.writer``): a
terminal event ends it; without one, a writer whose lock is free (on this host), or whose
heartbeat is old (on another host of a shared runs folder, where the lock may not be seen),
is gone, and the follower ends the watch with one line saying since when the record is no
longer written and which writer is gone. That end is the follower's own, shown, never
recorded. Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

from gputui.core import safeio
from gputui.core.events import (DeviceSample, Event, RunFailed, RunStarted, Status,
                                 event_from_dict, is_terminal)
from gputui.runs import runlock

LINE_BYTES = 4 * 2**20  # a longer line is no event (as runstore.read_events skips it)
WRITER_CHECK_S = 1.0  # how often a record that does not grow asks whether its writer lives


class _Tail:
    """The whole lines appended to one file since the last read (the file may not exist
    yet: it is looked for again at each read)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def lines(self) -> list[bytes]:
        try:
            fd = safeio.open_regular(self.path)
        except FileNotFoundError:
            return []
        try:
            chunks = []
            while True:
                chunk = os.pread(fd, 1 << 20, self.offset)
                if not chunk:
                    break
                chunks.append(chunk)
                self.offset += len(chunk)
        finally:
            os.close(fd)
        data = self.partial + b"".join(chunks)
        *whole, self.partial = data.split(b"\n")
        if len(self.partial) > LINE_BYTES:
            self.partial = b""
        return [line for line in whole if line and len(line) <= LINE_BYTES]


def _events(lines: list[bytes]) -> list[Event]:
    out = []
    for line in lines:
        try:
            out.append(event_from_dict(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out


def clock(t: float) -> str:
    """'07:12:03' today, '2026-11-27 07:12:03' on another day."""
    when = datetime.fromtimestamp(t)
    fmt = "%H:%M:%S" if when.date() == datetime.now().date() else "%Y-%m-%d %H:%M:%S"
    return when.strftime(fmt)


class RecordFollower:
    """A run's record, followed read-only: ``poll`` gives the events written since the last
    call, ``samples`` the devices' readings; ``done`` once a terminal event was read or the
    writer is gone (then ``gone`` says so, in one line). No Stop or Kill: ``read_only``."""

    read_only = True

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        self.devices: list = []  # the panels come from RunStarted, as the record has them
        self._events = _Tail(self.run_dir / "events.jsonl")
        self._telemetry = _Tail(self.run_dir / "telemetry.jsonl")
        self.writer = runlock.writer(self.run_dir)
        self.terminal: Event | None = None
        self.gone = ""  # why the watch ended without the record's own end ("" otherwise)
        self.last_t: float | None = None  # the time of the last event read
        self._checked = 0.0
        self.done = False

    @property
    def status(self) -> Status:
        """How the followed run ended (RUNNING until its terminal event was read); a watch
        whose writer is gone ends with a failure of its own (``gone`` says why)."""
        return Status.of(self.terminal)

    def started_here(self) -> str:
        """Who runs it, for the first line: 'started elsewhere (gputui pid 12 on node2)'."""
        w = self.writer
        if w is None:
            return "started elsewhere (no lock file: its writer is unknown)"
        return f"started elsewhere ({w.who()})"

    def poll(self, timeout: float = 0.0) -> list[Event]:
        """Events appended since the last call; waits at most ``timeout`` for some."""
        if self.done:
            return []
        deadline = time.monotonic() + timeout
        while True:
            out = _events(self._events.lines())
            if out or time.monotonic() >= deadline:
                break
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if not out and time.monotonic() - self._checked >= WRITER_CHECK_S:
            self._checked = time.monotonic()
            if self._writer_gone():
                # the lock may be freed a moment after the last event was written: read once
                # more, and end the watch only when the record has no end of its own
                out = _events(self._events.lines())
                if not any(is_terminal(e) for e in out):
                    out.append(self._gone_end())
        for i, ev in enumerate(out):
            self.last_t = ev.t if not self.gone else self.last_t
            if isinstance(ev, RunStarted) and ev.run_id:
                self.run_id = ev.run_id
            if is_terminal(ev):
                self.terminal = ev
                self.done = True
                return out[:i + 1]
        return out

    def _writer_gone(self) -> bool:
        """The writer went away (False while it lives, or when nothing says who it is)."""
        w = runlock.writer(self.run_dir)
        if w is None:  # no lock file: only the record's own end ends the watch
            return False
        self.writer = w
        return not w.alive()

    def _gone_end(self) -> Event:
        """The end of a record whose writer went away without ending it: shown, never
        recorded."""
        w = self.writer
        assert w is not None
        since = clock(self.last_t) if self.last_t is not None else "its start"
        if w.elsewhere and w.beat is not None:
            why = f"the writer, {w.who()}, has not beaten since {clock(w.beat)}"
        else:
            why = f"the writer {w.who()} is gone"
        self.gone = f"no longer written since {since}, {why}"
        return RunFailed(reason=self.gone)

    def samples(self) -> list[DeviceSample]:
        """The devices' readings appended since the last call."""
        return [e for e in _events(self._telemetry.lines()) if isinstance(e, DeviceSample)]

    # a RunHandle's other side, as the app's controls ask it: nothing to stop here
    def stop(self, *args: object) -> None:
        raise RuntimeError("a watched run is read-only: stop it where it runs")

    kill = stop
