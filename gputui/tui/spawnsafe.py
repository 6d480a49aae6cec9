"""Spawning training processes from inside a Textual app, without breaking either.

Two problems, both from standard file descriptors:

* Textual replaces ``sys.stderr`` with a capture object whose ``fileno()`` is -1.
  multiprocessing's resource tracker passes ``sys.stderr.fileno()`` to its own child, so the
  first ``Process.start()`` under Textual fails with "bad value(s) in fds_to_keep".
  :func:`ready_for_spawn` starts the tracker once with the real stderr.
* Spawned children inherit fds 1 and 2, which are the terminal Textual draws on: any stray
  output of a child (a library warning, a C++ backend's message) would scribble over the
  screen. :func:`private_terminal` gives Textual its own duplicate of the terminal for the
  app's lifetime; before the first spawn, :func:`ready_for_spawn` points fds 1 and 2 at a log
  file (in the runs folder), so children write there instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator


_state: dict = {"private": False, "routed": None}


def ready_for_spawn(child_output: Path | None = None) -> None:
    """Call on the UI thread before a spawn: start the resource tracker with a real stderr
    and, inside :func:`private_terminal`, send the children's fds 1 and 2 to ``child_output``."""
    from multiprocessing import resource_tracker

    if _state["private"] and child_output is not None and _state["routed"] is None:
        try:
            child_output.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(child_output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            _state["routed"] = child_output
        except OSError:
            pass  # children then write to the terminal: ugly, not fatal
    saved = sys.stderr
    try:
        if sys.__stderr__ is not None:
            sys.stderr = sys.__stderr__
        resource_tracker.ensure_running()
    except Exception:  # noqa: BLE001 - the launch reports any real problem itself
        pass
    finally:
        sys.stderr = saved


@contextlib.contextmanager
def private_terminal() -> Iterator[bool]:
    """While inside, Textual draws on duplicates of the terminal's fds, so fds 1 and 2 are
    free to be re-pointed for children. Yields False (and does nothing) when stdout or stderr
    is not a terminal, e.g. under tests or a pipe."""
    out, err = sys.__stdout__, sys.__stderr__
    if out is None or err is None or not (out.isatty() and err.isatty()):
        yield False
        return
    saved_out, saved_err = os.dup(1), os.dup(2)
    enc = err.encoding or "utf-8"
    tty_err = os.fdopen(os.dup(2), "w", buffering=1, encoding=enc, errors="replace")
    tty_out = os.fdopen(os.dup(1), "w", buffering=1, encoding=enc, errors="replace")
    old = (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr)
    # Textual's driver writes to sys.__stderr__ and sizes the screen from sys.__stdout__
    # (shutil.get_terminal_size): hand both the private copies of the terminal. (typeshed
    # declares sys.__stdout__ and sys.__stderr__ Final: replacing them is the point here.)
    sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr = (  # type: ignore[misc]
        tty_out, tty_err, tty_out, tty_err)
    _state.update(private=True, routed=None)
    try:
        yield True
    finally:
        for f in (tty_out, tty_err):
            f.flush()
        sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr = old  # type: ignore[misc]
        _state.update(private=False, routed=None)
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        tty_out.close()
        tty_err.close()
