"""Writing files so that a full disk or a refused write loses nothing already written.

Every file gputui writes goes through here. A whole file is written to a hidden temporary file
beside it, fsynced and renamed over it: a failure removes the temporary file and leaves the
previous version. An append-only log (events.jsonl, telemetry.jsonl) is cut back to its last
whole line when an append fails. Either failure raises :class:`WriteFailed`, whose message is
one line naming the file and the cause. Output folders are checked with
:func:`folder_problem` / :func:`file_problem` before work that would be lost. No torch here.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from gputui.core.errors import UserError

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class WriteFailed(UserError, OSError):
    """A file that could not be written; ``str()`` is one line naming it, the cause and a fix.
    An OSError, so callers that already handle OSError keep handling it."""

    def __init__(self, path: str | Path, cause: OSError | None, hint: str = ""):
        code = cause.errno if cause is not None else None
        super().__init__(code, _cause_words(cause))
        self.path = Path(path)
        self.hint = hint or default_hint(code)

    def __str__(self) -> str:
        hint = f" ({self.hint})" if self.hint else ""
        return f"cannot write {self.path}: {self.strerror}{hint}"

    @property
    def disk_full(self) -> bool:
        """The disk (or the user's quota) is full."""
        return self.errno in DISK_FULL


def _cause_words(cause: OSError | None) -> str:
    if cause is None:
        return "the write failed"
    if cause.errno:
        return cause.strerror or os.strerror(cause.errno)
    return str(cause)


def default_hint(code: int | None) -> str:
    """What to do about a failed write, by its errno."""
    if code in DISK_FULL:
        return "free space on that disk and try again"
    if code in REFUSED:
        return "choose a folder you can write to"
    if code == errno.ENAMETOOLONG:
        return "choose a shorter name"
    if code == errno.ENOENT:
        return "the folder it goes in does not exist"
    if code in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
        return "a file and a folder are in each other's way; choose another path"
    return ""


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc`` (itself, its cause or its context), or None. torch.save on a
    full disk raises a RuntimeError ("unexpected pos") whose context is the OSError."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def write_with(path: str | Path, fill: Callable[[BinaryIO], object], hint: str = "") -> Path:
    """Write to ``path`` as Unix tools do: a symbolic link is followed (the link stays and its
    target gets the bytes); a device or named pipe is opened and written in place; a regular
    file (or a new one) is written atomically: ``fill`` writes a temporary file beside it,
    which is fsynced and renamed over it. On any failure the temporary file is removed and the
    file keeps its previous content; a failure of the disk raises WriteFailed."""
    shown = Path(path)
    # asked of the path as given: the kernel follows /proc's links to a pipe or a terminal
    # (/proc/self/fd/1, /dev/stdout), which realpath turns into a name that does not exist
    if _is_special(shown):
        return _write_in_place(shown, shown, fill, hint)
    path = Path(os.path.realpath(shown))
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _remove(tmp)
        cause = os_error_in(exc)
        if cause is None:
            raise
        raise WriteFailed(shown, cause, hint) from None
    fsync_dir(path.parent)
    return shown


def _is_special(path: Path) -> bool:
    """``path`` exists and is neither a regular file nor a folder (a device, a pipe, a socket):
    renaming over it would replace the thing itself, so it is written in place."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_in_place(path: Path, shown: Path, fill: Callable[[BinaryIO], object],
                    hint: str) -> Path:
    try:
        with open(path, "wb") as fh:
            fill(fh)
            fh.flush()
    except BaseException as exc:
        cause = os_error_in(exc)
        if cause is None:
            raise
        raise WriteFailed(shown, cause, hint) from None
    return shown


def make_folder(folder: str | Path, hint: str = "") -> Path:
    """``mkdir -p folder``; a failure (a file in the way, no permission) raises WriteFailed."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteFailed(folder, exc, hint) from None
    return folder


def write_atomic(path: str | Path, data: str | bytes, hint: str = "") -> Path:
    """Write text (UTF-8) or bytes to ``path`` atomically (see :func:`write_with`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_with(path, lambda fh: fh.write(raw), hint)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:  # nothing more can be done about it here
        pass


def fsync_dir(folder: str | Path) -> None:
    """Make a rename in ``folder`` durable (best effort: some file systems refuse)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    _fsync_and_close(fd)


def _fsync_and_close(fd: int) -> None:
    """fsync ``fd`` where the file system allows it, then close it."""
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AppendLog:
    """An append-only file of whole lines: each ``append`` adds complete lines or nothing (a
    failed write is cut back to the last whole line, then WriteFailed is raised)."""

    def __init__(self, path: str | Path, hint: str = ""):
        self.path, self.hint = Path(path), hint
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                           0o644)
        except OSError as exc:
            raise WriteFailed(self.path, exc, hint) from None

    def append(self, text: str) -> None:
        """Append ``text`` (one or more lines ending in a newline)."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the log is closed")
        data = memoryview(text.encode("utf-8"))
        start = os.fstat(self._fd).st_size
        try:
            while data:
                n = os.write(self._fd, data)
                data = data[n:]
        except OSError as exc:
            try:  # a torn line would hide the lines after it from a reader
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise WriteFailed(self.path, exc, self.hint) from None

    def close(self) -> None:
        """fsync and close (a failed fsync is not an error here: every line was written)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _fsync_and_close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None


def folder_problem(path: str | Path, what: str) -> str | None:
    """Why files cannot be written in folder ``path``, as one line naming ``what`` it is (e.g.
    "--runs-dir"); None when a probe file could be written and removed there (or, for a folder
    not made yet, in the nearest folder above it, which is left as it was)."""
    try:
        return _folder_problem(Path(path), what)
    except OSError as exc:  # a name too long, a loop of links: stat itself fails
        return _cannot_write(what, Path(path), exc)


def _folder_problem(folder: Path, what: str) -> str | None:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "it is" if existing == folder else f"{existing} is"
        return f"{what} {folder}: {where} a file, not a folder; choose a folder"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".gputui-probe-")
    except OSError as exc:
        return _cannot_write(what, folder, exc)
    try:
        os.write(fd, b"\n")  # a full disk refuses the first byte, not the empty file
    except OSError as exc:
        return _cannot_write(what, folder, exc)
    finally:
        os.close(fd)
        _remove(Path(probe))
    return None


def _cannot_write(what: str, folder: Path, exc: OSError) -> str:
    hint = default_hint(exc.errno)
    return f"{what} {shown(folder)}: cannot write there: {_cause_words(exc)}" + \
        (f" ({hint})" if hint else "")


def shown(path: str | Path, limit: int = 160) -> str:
    """A path as a message names it: whole, or its start and end around the length when it
    is longer than ``limit`` characters."""
    text = str(path)
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...{text[-limit // 4:]} ({len(text):,} characters)"


def file_problem(path: str | Path, what: str) -> str | None:
    """Why file ``path`` cannot be written (its folder is checked as :func:`folder_problem`
    does), as one line naming ``what`` it is; None when it can."""
    try:
        return _file_problem(path, what)
    except OSError as exc:  # a name too long, a loop of links: stat itself fails
        return _cannot_write(what, Path(path), exc)


def _file_problem(path: str | Path, what: str) -> str | None:
    target = Path(os.path.realpath(path))
    if Path(path).is_dir():
        return f"{what} {path}: it is a folder; give a file name"
    if _is_special(Path(path)):  # written in place: its own permission is what counts
        if os.access(path, os.W_OK):
            return None
        return f"{what} {path}: cannot write there: {os.strerror(errno.EACCES)} " \
               f"({default_hint(errno.EACCES)})"
    return folder_problem(target.parent, what)
