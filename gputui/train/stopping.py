"""The one stop path, from the user's key to the step every rank agrees to stop at.

1. **The ask.** In the app, the run screen's Stop key (``tui/screens/run_controls.py``) and
   the app's own exit (``tui/lifecycle.stop_then_kill``) call ``RunHandle.stop(reason)``.
   Headless, ``signals.Supervisor`` notes SIGINT, SIGTERM and SIGHUP in a handler and its
   ``check``, called from the poll loop, calls ``RunHandle.stop(signals.stop_reason(sig))``;
   a second signal, or a stop that outlasts ``run.stop_grace_s``, is ``RunHandle.kill``.
2. **The channel.** ``RunHandle.stop`` is ``handoff.StopChannel.ask``: the reason goes into a
   shared buffer and a shared event is set. Every process of the run holds that channel (the
   child, a warm worker, the elastic agent and each rank, through ``LaunchSpec.stop``).
3. **The flag.** In a training process, :class:`StopFlag` is the loop's ``should_stop``: true
   once the channel is asked, or once a stop signal reached this process itself (a terminal
   signals its whole process group; systemd and SLURM signal every process of the job), which
   ``signals.watch`` takes in a thread and hands to :meth:`StopFlag.on_signal`. The elastic
   agent, which runs no loop, passes a signal it receives to its ranks by asking the channel.
4. **The agreement** (ddp, fsdp). Each rank's flag is wrapped in :class:`AgreedStop`: a tiny
   MAX collective (``strategy.agree_stop``, about every 0.25 s), so every rank leaves the loop
   at the same step and none waits forever in a collective.
5. **The end.** ``loop.train`` checks the flag between steps, writes the checkpoint and
   returns "stopped"; ``worker.execute`` records ``RunStopped`` with the flag's reason (the
   first asked), through the one record writer (``recorder.Recorder``).

The faults this path does not see, each handled by code that feeds it or ends the run:

- the parent died: :func:`parent_gone`, polled by StopFlag's watch thread (a cold child, each
  rank), by the warm worker between runs (``warm._watch_parent``) and by the agent before its
  ranks start (``agent._Watchdog``), becomes a stop with :data:`PARENT_GONE`;
- a stop asked before any rank started (at a multi-node rendezvous): ``agent._Watchdog`` ends
  the record itself, since no rank is there to agree;
- SIGTERM from the elastic agent to a rank is torch tearing the job down after a failure, not
  a stop: ``ranks._RankStop`` ends the rank at once;
- the gputui interpreter exits with runs alive: ``launcher._stop_all`` (atexit) asks them to
  stop through ``RunHandle.stop``, then kills what has not ended;
- a stop that is not honoured: the kill (step 1) ends the processes and the parent ends the
  record (``RunHandle``, via the record writer).

Torch-free; child side.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

from gputui.train.handoff import StopChannel

PARENT_GONE = "the gputui process that launched the run exited"
PARENT_POLL_S = 0.5  # how often a child looks for its parent


def parent_gone(parent_pid: int, origin_pid: int = 0) -> bool:
    """This process's parent is no longer ``parent_pid`` (it died and this one was adopted),
    or ``origin_pid`` (the gputui process, when the parent is the elastic agent) has ended."""
    return os.getppid() != parent_pid or bool(origin_pid and not _alive(origin_pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StopFlag:
    """A training process's ``should_stop``: the parent's channel, a stop signal this process
    received (``signals=True``, see ``signals.watch``), or its parent's death
    (``parent_pid``, with ``origin_pid`` for a rank, whose parent is the agent)."""

    def __init__(self, channel: StopChannel | None = None, parent_pid: int = 0,
                 origin_pid: int = 0, signals: bool = False):
        self.channel, self.parent_pid, self.origin_pid = channel, parent_pid, origin_pid
        self._reason = ""
        self._local = threading.Event()
        if signals:  # before any thread starts: threads inherit the blocked signals
            from gputui.core import signals as signals_mod

            signals_mod.watch(self.on_signal)
        if parent_pid:
            threading.Thread(target=self._watch_parent, daemon=True).start()

    def request(self, reason: str) -> None:
        """Stop at the next step; the first reason given is the one recorded."""
        if not self._local.is_set():
            self._reason = reason
            self._local.set()

    def on_signal(self, signum: int, sender: int) -> None:
        """A stop signal reached this process (see ``signals.watch``)."""
        from gputui.core.signals import stop_reason

        self.request(stop_reason(signum))

    @property
    def reason(self) -> str:
        """Why the run stops: this process's own reason, else the parent's."""
        if self._reason:
            return self._reason
        return (self.channel.reason() if self.channel else "") or "stopped by user"

    def _watch_parent(self) -> None:
        while not self._local.wait(PARENT_POLL_S):
            if parent_gone(self.parent_pid, self.origin_pid):
                self.request(PARENT_GONE)

    def __call__(self) -> bool:
        return self._local.is_set() or (self.channel is not None and self.channel.asked())


class AgreedStop:
    """A stop every rank agrees on: each check is a tiny collective (MAX of the flags), so all
    ranks leave the loop at the same step and none waits forever in a collective."""

    def __init__(self, flag: Callable[[], bool], strategy):
        self.flag, self.strategy = flag, strategy
        self.reason = "stopped on another rank"

    def __call__(self) -> bool:
        agreed = self.strategy.agree_stop(bool(self.flag()))
        # asked after the collective: a stop request set in between is this rank's own too
        if agreed and self.flag():
            self.reason = getattr(self.flag, "reason", "stopped by user")
        return agreed
