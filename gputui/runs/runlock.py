"""Which run folders and sweeps are in use: the gputui process that runs a record holds an
exclusive ``fcntl.flock`` on ``<run folder>/.gputui.lock`` while the run is active, and so does
the process running a resume of it on the folder it resumes; a sweep's process holds
``<runs>/sweeps/<sweep id>.lock`` while it runs the sweep. The kernel drops a lock when its
process ends, however it ends (SIGKILL included), so a lock that can be taken means nothing is
active there, and a killed run or sweep can be resumed at once.

A lock is taken (:func:`claim`) at the moment the work starts, never after a check that it is
free: two commands started together cannot both pass (the check and the taking are one
system call). The file holds the holder's pid and what it is doing, for the refusal's message,
then (after a tab) its host and a heartbeat: the time, rewritten every BEAT_S while the run
lasts (:meth:`RunLock.beat`), so a reader on another node of a shared runs folder, where the
lock may not be seen, can still tell a writer alive from one that is gone (:func:`writer`).
Torch-free.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gputui.core import safeio
from gputui.core.errors import UserError

LOCK_NAME = ".gputui.lock"
TEXT_BYTES = 200  # the holder's pid and what it does, space-padded
BEAT_S = 5.0  # how often a running record's holder rewrites its heartbeat
# a heartbeat older than this, from a holder on another host, means the holder is gone
BEAT_STALE_S = 6 * BEAT_S


class InUse(UserError, RuntimeError):
    """The folder or sweep is held by another gputui process; the message says which."""


class RunLock:
    """An exclusive hold on a lock file; released by ``release`` or the process's end."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd
        self._what = ""
        self._beating: threading.Event | None = None

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    def label(self, what: str) -> None:
        """Say what the holder is doing (the text a refused command quotes)."""
        fd = self._fd
        if fd is None:
            return
        self._what = what
        # one write of a fixed width, never a truncation: a reader sees the old or the new text
        text = f"{os.getpid()} {what}\thost={HOST} beat={time.time():.1f}"
        try:
            os.pwrite(fd, text.encode()[:TEXT_BYTES - 1].ljust(TEXT_BYTES - 1) + b"\n", 0)
        except OSError:
            pass  # the lock is what counts; the text only names the holder

    def beat(self, every_s: float = BEAT_S) -> None:
        """Rewrite the heartbeat every ``every_s`` until :meth:`release` (a daemon thread:
        it ends with the process, and its last beat then grows old)."""
        if self._fd is None or self._beating is not None:
            return
        stop = self._beating = threading.Event()

        def run() -> None:
            while not stop.wait(every_s):
                self.label(self._what)

        threading.Thread(target=run, name="gputui-lock-beat", daemon=True).start()

    def release(self) -> None:
        """Give the folder back (idempotent)."""
        if self._beating is not None:
            self._beating.set()
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def _take(path: Path, what: str) -> RunLock | None:
    """The lock on ``path`` for this process; None when another process holds it. OSError
    when the lock file cannot be made."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    lock = RunLock(path, fd)
    lock.label(what)
    return lock


def hold(run_dir: str | Path, run_id: str) -> RunLock | None:
    """Take the folder's lock for the run ``run_id`` in this process; None when another
    process holds it (or the lock file cannot be made: the run goes on, unguarded)."""
    try:
        return _take(Path(run_dir) / LOCK_NAME, run_id)
    except OSError:
        return None


def claim(run_dir: str | Path, run_id: str = "") -> RunLock | None:
    """Take the lock of a folder this process is about to resume (``run_id``: the new run's
    id, "" while it has none); raises :class:`InUse` (one line) when another process holds
    it. None when no lock file can be made there (a read-only record: nothing to guard)."""
    folder = Path(run_dir)
    try:
        lock = _take(folder / LOCK_NAME, run_id)
    except OSError:
        return None
    if lock is None:
        raise InUse(f"run.resume_from: {folder.name} is {holder(folder) or 'in use'}; "
                    f"stop that run first, then resume")
    return lock


def sweep_lock_path(runs_dir: str | Path, sweep_id: str) -> Path:
    """The lock file of a sweep, beside its manifest."""
    return Path(runs_dir) / "sweeps" / f"{sweep_id}.lock"


def claim_sweep(runs_dir: str | Path, sweep_id: str) -> RunLock | None:
    """Take a sweep's lock for this process; raises :class:`InUse` (one line) when another
    gputui process is running that sweep. None when no lock file can be made."""
    path = sweep_lock_path(runs_dir, sweep_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _take(path, f"sweep {sweep_id}")
    except OSError:
        return None
    if lock is None:
        pid = _holder_pid(path)
        who = f"gputui pid {pid}" if pid else "another gputui process"
        raise InUse(f"sweep {sweep_id} is running ({who}); wait for it to end, stop it "
                    f"(Ctrl-C in its terminal), or pass --fresh to start a separate sweep")
    return lock


def _holder_pid(path: Path) -> str:
    try:
        fd = safeio.open_regular(path)
    except OSError:
        return ""
    try:
        pid = _text(fd).partition(" ")[0]
    finally:
        os.close(fd)
    return pid if pid.isdecimal() else ""


def _text(fd: int) -> str:
    """The holder's text; a holder that has just taken the lock writes it a moment later."""
    for _ in range(20):
        try:
            text = os.pread(fd, TEXT_BYTES, 0).decode("utf-8", "replace").strip()
        except OSError:
            return ""
        if text:
            return text
        time.sleep(0.005)
    return ""


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
        pid, _, run_id = _text(fd).partition("\t")[0].partition(" ")
        who = f"gputui pid {pid}" if pid.isdecimal() else "a gputui process"
        if run_id != Path(run_dir).name:
            return f"being resumed{f' by run {run_id}' if run_id else ''} ({who})"
        return f"still running ({who})"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


HOST = socket.gethostname()


@dataclass(frozen=True)
class Writer:
    """Who holds (or last held) a run folder's lock, as its lock file says: ``held`` is what
    the lock itself says (None: the lock file cannot be read); ``pid``, ``host`` and ``beat``
    (the last heartbeat, seconds since the epoch; None in older records) are its text."""

    held: bool | None
    pid: int | None = None
    host: str = ""
    beat: float | None = None
    what: str = ""

    @property
    def elsewhere(self) -> bool:
        """The holder is on another host (its pid means nothing here)."""
        return bool(self.host) and self.host != HOST

    def who(self) -> str:
        """'gputui pid 123 on node2' (the host only when it is not this one)."""
        who = f"gputui pid {self.pid}" if self.pid else "a gputui process"
        return f"{who} on {self.host}" if self.elsewhere else who

    def alive(self, now: float | None = None) -> bool:
        """The holder is still there: the lock is held, or (held elsewhere, where this host
        may not see the lock) its heartbeat is recent."""
        if self.held:
            return True
        if self.elsewhere and self.beat is not None:
            return (time.time() if now is None else now) - self.beat < BEAT_STALE_S
        if self.held is None and not self.elsewhere and self.pid:  # the lock cannot say
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except OSError:  # another user's process: it exists
                return True
            return True
        return False


def writer(run_dir: str | Path) -> Writer | None:
    """The run folder's lock holder, held or not (:class:`Writer`); None when the folder has
    no lock file (an older record, or one made elsewhere). Reads only: the lock is tested
    with a shared lock taken and dropped at once, the text with pread."""
    try:
        fd = safeio.open_regular(Path(run_dir) / LOCK_NAME)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held: bool | None = False
        except BlockingIOError:
            held = True
        except OSError:
            held = None
        return _parse(_text(fd), held)
    finally:
        os.close(fd)


def _parse(text: str, held: bool | None) -> Writer:
    main, _, extra = text.partition("\t")
    pid, _, what = main.partition(" ")
    fields = dict(f.partition("=")[::2] for f in extra.split())
    try:
        beat: float | None = float(fields["beat"])
    except (KeyError, ValueError):
        beat = None
    return Writer(held, int(pid) if pid.isdecimal() else None, fields.get("host", ""), beat,
                  what)
