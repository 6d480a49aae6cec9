"""The parent side's process hygiene: no process gputui starts outlives it.

The launcher makes itself the subreaper of what it starts, owns a multiprocessing resource
tracker that ends with it, and kills a whole process tree when a run or a measurement must end
at once. :func:`ask_children` is the one way to run a measuring child (the cut check, bench-comm,
predict's collectives, the plan's tracer and measured ranks): spawn, wait for its answer with a
deadline, end it on a stop signal, kill its tree, collect what it said. Torch-free.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import queue as queue_mod
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import psutil

from gputui.core import ompwait, signals


def adopt_orphans() -> None:
    """Make this process the subreaper of what it starts (Linux): a process orphaned by the
    death of its parent (a rank's fork server after the agent died) is re-parented here, not
    to init, so the handle can wait for it and reap it."""
    if _ADOPTING or not sys.platform.startswith("linux"):
        return
    _ADOPTING.append(True)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


_ADOPTING: list[bool] = []


def own_tracker() -> None:
    """This process's multiprocessing resource tracker, started so that it ends with it:
    immune to the group's SIGHUP and a job's SIGUSR1 (it ignores SIGINT and SIGTERM itself;
    killed, it would be restarted at exit by the semaphores' clean-up and outlive this
    process), and stopped and
    reaped by the last of multiprocessing's exit finalisers, after every clean-up that uses it."""
    if _TRACKED:
        return
    _TRACKED.append(True)
    from multiprocessing import resource_tracker

    # The tracker unlinks the semaphores of a process gputui had to kill (a stop signal ends a
    # measurement's processes at once), then warns of "leaked semaphore objects" on its way
    # out: nothing is left, and the warning names no fault, so the tracker is started without
    # it (its command line takes this interpreter's -W options).
    quiet = "ignore:resource_tracker:UserWarning"
    sys.warnoptions.append(quiet)
    try:
        # blocked while it starts, and so for good in it (a mask is inherited through exec, and
        # the tracker unblocks only SIGINT and SIGTERM, which it ignores): SIGUSR1 too (SLURM's
        # --signal=USR1 reaches every process of a job step, and its default action would end
        # the tracker). Blocked, not ignored: one that comes meanwhile waits for this process
        # (its handler, the stop contract's) rather than being lost; and any thread may
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, signal.SIGUSR1})
        try:
            resource_tracker.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    finally:
        sys.warnoptions.remove(quiet)

    def stop() -> None:
        try:
            # private, so absent from typeshed's stubs; a missing one is harmless
            resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            pass

    mp_util.Finalize(None, stop, exitpriority=-100)


_TRACKED: list[bool] = []


def kill_tree(pid: int | None) -> None:
    """SIGKILL ``pid`` and every process under it (gone ones are skipped)."""
    if not pid:
        return
    try:
        children = psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - the process may already be gone
        children = []
    for proc in [*children]:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


POLL_S = 0.5  # how often the wait looks at the stop signals, the deadline and the children


@dataclass
class Answer:
    """What measuring children said: their messages in order; ``complete`` when the last
    one ended the answer, ``timed_out`` when the deadline came first; their exit codes."""

    messages: list[Any] = field(default_factory=list)
    complete: bool = False
    timed_out: bool = False
    exitcodes: list[int | None] = field(default_factory=list)


def child_of(process_name: str, name: str) -> bool:
    """Whether a process is one of :func:`ask_children`'s children started as ``name`` (one
    child is named ``name``, several ``name-0``, ``name-1``, ...)."""
    return process_name == name or process_name.startswith(name + "-")


def ask_children(starts: Sequence[tuple[Callable[..., None], tuple]], name: str,
                 timeout: float, done: Callable[[Any], bool] = lambda message: True,
                 stoppable: bool = True, grace_s: float = 10.0) -> Answer:
    """Spawn one process per ``(target, args)``, each called as ``target(*args, queue)``, and
    collect what they put on the queue until ``done(message)`` says the answer is whole (by
    default the first message is), every child has exited, or ``timeout`` seconds pass.

    No process outlives the call: a stop signal (``stoppable``: raised as
    ``signals.Interrupted``, also when it cut a result short), Ctrl-C or any error kills every
    child's tree at once; otherwise the children get ``grace_s`` to exit (0: killed at once,
    for a child running the user's code), then their trees are killed. The children start with
    the stop signals held (``signals.deferred``: a measuring child leaves a stop to its parent)
    and OpenMP told to wait passively, as a run's ranks do."""
    own_tracker()  # before the queue: starting the tracker would unblock the signals
    ompwait.for_children()  # before the children load torch
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q),
                         name=name if len(starts) == 1 else f"{name}-{i}")
             for i, (target, args) in enumerate(starts)]
    answer = Answer()
    with signals.deferred() if stoppable else contextlib.nullcontext():
        for proc in procs:  # held from its birth: never a traceback in its imports
            proc.start()
    deadline = time.monotonic() + timeout
    try:
        while not answer.complete:
            if stoppable:
                signals.raise_if_stopped()
            try:
                message = q.get(timeout=POLL_S)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs):
                    try:  # what a child put just before it exited
                        message = q.get(timeout=1.0)
                    except queue_mod.Empty:
                        break
                elif time.monotonic() > deadline:
                    answer.timed_out = True
                    break
                else:
                    continue
            answer.messages.append(message)
            answer.complete = bool(done(message))
        if stoppable:
            signals.raise_if_stopped()  # a result that a signal cut short is no result
    except BaseException:  # a stop signal, Ctrl-C: no waiting for the children to finish
        for proc in procs:
            kill_tree(proc.pid)
        raise
    finally:
        end = time.monotonic() + grace_s
        for proc in procs:
            if grace_s > 0:
                proc.join(timeout=max(0.0, end - time.monotonic()))
            if proc.exitcode is None:  # still running (a process already reaped is not killed)
                kill_tree(proc.pid)
                proc.join(timeout=5)
        answer.exitcodes = [p.exitcode for p in procs]
    return answer


def set_process_name(name: str) -> None:
    """This process's name as ps, top and psutil show it (Linux: /proc/PID/comm, 15
    characters); elsewhere nothing changes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:  # noqa: BLE001 - a name is a convenience
        pass


_FORKABLE = True  # nothing computed in this process yet


def mark_unforkable() -> None:
    """This process computes (a run host's single-process run: its OpenMP threads start) or
    sets up CUDA (a warm host's GPUs): a fork of it is then no safe fork server
    (``agent._fork_own_server``)."""
    global _FORKABLE
    _FORKABLE = False


def forkable() -> bool:
    return _FORKABLE
