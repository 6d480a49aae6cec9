"""The parent side's process hygiene: no process gputui starts outlives it.

The launcher makes itself the subreaper of what it starts, owns a multiprocessing resource
tracker that ends with it, and kills a whole process tree when a run or a measurement must end
at once. Torch-free.
"""

from __future__ import annotations

import multiprocessing.util as mp_util
import os
import signal
import sys
import threading


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
        if threading.current_thread() is threading.main_thread():
            # ignored, inherited through exec: SIGUSR1 too (SLURM's --signal=USR1 reaches
            # every process of a job step, and its default action would end the tracker)
            old = {sig: signal.signal(sig, signal.SIG_IGN)
                   for sig in (signal.SIGHUP, signal.SIGUSR1)}
            try:
                resource_tracker.ensure_running()
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
        else:
            resource_tracker.ensure_running()
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
        import psutil

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
