"""Which run folders are in use: the gputui process that runs a record holds an exclusive
``fcntl.flock`` on ``<run folder>/.gputui.lock`` while the run is active, and so does the
process running a resume of it on the folder it resumes. The kernel drops the lock when that
process ends, however it ends, so a lock that can be taken means no run is active there.
The file holds the holder's pid and run id, for the message. Local file systems; torch-free.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gputui.core import safeio

LOCK_NAME = ".gputui.lock"


class RunLock:
    """An exclusive hold on a run folder (``hold``); released by ``release`` or process end."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir = run_dir
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the folder back (idempotent)."""
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def hold(run_dir: str | Path, run_id: str) -> RunLock | None:
    """Take the folder's lock for the run ``run_id`` in this process; None when another
    process holds it (or the lock file cannot be made: the run goes on, unguarded)."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {run_id}\n".encode(), 0)
    except OSError:
        pass  # the lock is what counts; the text only names the holder
    return RunLock(Path(run_dir), fd)


def holder(run_dir: str | Path) -> str | None:
    """Why the folder is in use ("still running (gputui pid 123)", "being resumed by run ID
    (gputui pid 123)"), or None when no process holds it."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = safeio.open_regular(path)
    except OSError:
        return None  # no lock file (an older record, or never run here): nothing to tell
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        pid, _, run_id = text.partition(" ")
        who = f"gputui pid {pid}" if pid.isdecimal() else "a gputui process"
        if run_id and run_id != Path(run_dir).name:
            return f"being resumed by run {run_id} ({who})"
        return f"still running ({who})"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
