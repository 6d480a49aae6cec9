"""Reading files that may not be what their names say: records and presets.

A reader here opens only regular files (a fifo, a socket, a device such as /dev/zero behind a
symlink, or a folder is refused with its kind named, and opening never blocks: O_NONBLOCK),
reads small files within a size bound, and streams line files with a bound per line. Every
refusal is an :class:`Unreadable` (an OSError), so callers that already skip unreadable
files skip these too. Torch-free and Textual-free.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

SMALL_LIMIT = 1 << 20  # a preset, a config.toml or a summary.json is a few KiB
LINE_LIMIT = 4 << 20  # one event line (a run_started event carries the whole config)
_CHUNK = 1 << 16


class Unreadable(OSError):
    """A file that is not read: not a regular file, or larger than its bound. The message is
    one line naming the file and why."""


def kind_of(mode: int) -> str:
    """What a file mode is, in words ("a folder", "a fifo", ...)."""
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a fifo (named pipe)"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "not a regular file"


def reason(exc: OSError) -> str:
    """An OSError as a short clause: "Permission denied", or an Unreadable's own words."""
    if isinstance(exc, Unreadable):
        return str(exc)
    return exc.strerror or str(exc) or type(exc).__name__


def open_regular(path: str | Path) -> int:
    """An fd open for reading on ``path``, which must be a regular file (symlinks followed);
    Unreadable otherwise, OSError when it cannot be opened. Never blocks on a fifo."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno is not None and exc.strerror:  # ENXIO for a socket: say what it is
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise exc from None
            if not stat.S_ISREG(mode):
                raise Unreadable(f"{path.name} is {kind_of(mode)}, not a file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable(f"{path.name} is {kind_of(mode)}, not a file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | Path, limit: int = SMALL_LIMIT) -> bytes:
    """The whole of a small regular file; Unreadable when it holds more than ``limit`` bytes."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Unreadable(f"{Path(path).name} is larger than {limit // 1024} KiB, too large for "
                         f"this kind of file")
    return data


def read_text(path: str | Path, limit: int = SMALL_LIMIT, errors: str = "strict") -> str:
    """A small regular file as UTF-8 text (UnicodeDecodeError with errors="strict")."""
    return read_bytes(path, limit).decode("utf-8", errors=errors)


def iter_lines(path: str | Path, max_line: int = LINE_LIMIT) -> Iterator[str]:
    """The lines of a regular file, read as a stream (without their newline; invalid UTF-8
    replaced). A line longer than ``max_line`` bytes is skipped whole, never held."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        while True:
            line = fh.readline(max_line + 1)
            if not line:
                return
            if len(line) > max_line and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # drop the rest of the long line
                    line = fh.readline(_CHUNK)
                continue
            yield line.rstrip(b"\n").decode("utf-8", errors="replace")


MAX_DEPTH = 32  # tables and lists within each other; a config needs 3


class BadToml(ValueError):
    """TOML text the parser could not read or that nests too deeply; one line."""

    def __init__(self, message: str, too_deep: bool = False):
        super().__init__(message)
        self.too_deep = too_deep


def parse_toml(text: str) -> dict:
    """``tomllib.loads`` that answers every bad input with :class:`BadToml` (a ValueError):
    syntax errors, nesting deep enough to exhaust the parser's recursion, integers longer than
    Python converts, and values nested more than MAX_DEPTH deep (which would exhaust the
    recursion of whatever writes them back: tomli_w, json)."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise BadToml(f"nested too deeply to read (at most {MAX_DEPTH} levels of tables "
                      f"and lists)", too_deep=True) from None
    except ValueError as exc:  # TOMLDecodeError, or an integer past int's digit limit
        raise BadToml(str(exc).splitlines()[0] if str(exc) else "not valid TOML") from None
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:  # iterative: the check itself must not recurse
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadToml(f"nested more than {MAX_DEPTH} levels deep (tables and lists)",
                          too_deep=True)
        children = value.values() if isinstance(value, dict) else \
            value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return data
