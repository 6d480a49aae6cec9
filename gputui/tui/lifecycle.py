"""How the app ends when it is not asked to quit: a stop signal, or a crash.

A stop signal (SIGINT, SIGTERM, SIGHUP: see ``gputui.core.signals``, taken by the app's
``on_stop_signal``) stops the active run gracefully, with the signal named in its record, and
the app leaves when the run has ended (exit status 128 + the signal's number); a second
signal, or a stop that outlasts ``run.stop_grace_s``, kills the run. SIGHUP means the
terminal is gone: the app's output goes to /dev/null from then on
(:func:`detach_terminal`), so drawing can never fail on a hung-up terminal.

A crash (an exception Textual could not handle) stops the run gracefully too, with the crash
as the reason, and :func:`crash_line` gives the one line the CLI prints before exiting 1.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, NoReturn

from gputui.core.errors import fault_line

KILL_WAIT_S = 5.0


def detach_terminal() -> None:
    """The terminal hung up: point every descriptor the app draws on at /dev/null."""
    fds = {0, 1, 2}
    for stream in (sys.__stdin__, sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            fds.add(stream.fileno())
        except (AttributeError, OSError, ValueError):
            continue
    fds = {fd for fd in fds if fd >= 0 and _is_tty(fd)}  # not the children's output log
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in fds:
        if fd >= 0:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    os.close(null)


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def stop_then_kill(handle: Any, reason: str, grace_s: float) -> None:
    """The app is going away with a run active: stop it gracefully with ``reason``, kill it
    if it has not ended within ``grace_s``; its record ends either way."""
    try:
        handle.stop(reason)
        deadline = time.monotonic() + grace_s
        while not handle.done and time.monotonic() < deadline:
            handle.poll(timeout=0.2)
        if not handle.done:
            handle.kill(f"killed: {reason}, and the stop did not end within {grace_s:g} s")
            handle.wait(timeout=KILL_WAIT_S)
    except Exception:  # noqa: BLE001 - the app is exiting: nothing left to tell
        try:
            handle.kill(reason)
        except Exception:  # noqa: BLE001
            pass


def crash_line(exc: BaseException | None) -> str:
    """The one line a crash leaves on stderr."""
    if exc is None:
        return "gputui: error: the app ended with an internal error"
    return f"gputui: error: the app crashed: {fault_line(exc)}"


def leave(code: int, threads_s: float = 2.0) -> NoReturn:
    """End the app's process now with ``code``: what the interpreter's exit does that matters
    (the non-daemon threads, bounded by ``threads_s``; the exit handlers, which close the
    warm hosts and run multiprocessing's finalizers; the output flushed), then ``os._exit``,
    skipping the teardown of every module the app loaded (0.5-1 s of a 2 s quit here). Only
    for the process that ran the app, after it returned."""
    import atexit

    deadline = time.monotonic() + threads_s  # all of them together, not each
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)
