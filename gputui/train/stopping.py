"""The one stop path: one flag per run (``handoff.StopChannel``), held by the parent, the run
host and every rank, and the step the ranks agree to stop at.

Who asks (the first reason asked is the one recorded):

- the user: the run screen's Stop, the app's exit, the headless ``signals.Supervisor`` and
  the interpreter's exit (``launcher._stop_all``) all call ``RunHandle.stop(reason)``;
- a stop signal (SIGINT, SIGTERM, SIGHUP) that reaches the host or a rank (a terminal signals
  its whole process group, systemd and SLURM every process of the job): ``signals.watch``
  takes it in a thread and asks the flag, except SIGTERM from the host to a rank, which is
  torch tearing the job down after a failure (the rank ends at once);
- the parent's death: the host's watch (``host.py``) asks with :data:`PARENT_GONE`.

Who reads: the training loop's ``should_stop`` is :class:`RunStop` over the flag; in a
multi-process run each rank's is wrapped in :class:`AgreedStop` (a tiny MAX collective), so
every rank leaves at the same step and none waits forever in a collective. While no rank has
started (a multi-node rendezvous) the host ends the run itself (``agent.py``). A stop that is
not honoured ends by the parent's kill, and the parent ends the record the host could not.

Torch-free; child side.
"""

from __future__ import annotations

import os
from typing import Callable

from gputui.core import signals
from gputui.core.handoff import StopChannel

PARENT_GONE = "the gputui process that launched the run exited"
PARENT_POLL_S = 0.5  # how often a host or a rank looks for its parent
ANOTHER_RANK = "stopped on another rank"
# the reasons a rank tells the others in the agreement itself (one number in the same MAX
# all-reduce): a rank that had not yet seen the stop itself (SLURM signals every process of a
# job, each at its own moment) records why, not only that another rank stopped
SHARED_REASONS = ("stopped by user", PARENT_GONE,
                  *(signals.stop_reason(s) for s in signals.STOP_SIGNALS))


def reason_code(reason: str) -> int:
    """The number a stop's reason travels as: 0 no stop, 1 a reason the table does not name
    (the lowest: a named one asked on another rank wins the MAX), 2 on the table's."""
    return SHARED_REASONS.index(reason) + 2 if reason in SHARED_REASONS else 1


def agreed_reason(code: int) -> str:
    """The reason a rank records for a stop the agreement brought from another rank."""
    if 2 <= code < len(SHARED_REASONS) + 2:
        return f"{SHARED_REASONS[code - 2]} (on another rank)"
    return ANOTHER_RANK


def parent_gone(parent_pid: int, origin_pid: int = 0) -> bool:
    """This process's parent is no longer ``parent_pid`` (it died and this one was adopted),
    or ``origin_pid`` (the host, for a rank forked by the fork server) has ended."""
    return os.getppid() != parent_pid or bool(origin_pid and not _alive(origin_pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunStop:
    """The loop's ``should_stop``: the run's flag is set; ``reason`` the first reason asked."""

    def __init__(self, channel: StopChannel):
        self.channel = channel

    @property
    def reason(self) -> str:
        return self.channel.reason() or "stopped by user"

    def __call__(self) -> bool:
        return self.channel.asked()


class AgreedStop:
    """A stop every rank agrees on: each check is a tiny collective (MAX of the ranks' reason
    codes), so all ranks leave the loop at the same step, none waits forever in a collective,
    and a rank stopped by another's request records that rank's reason."""

    def __init__(self, flag: Callable[[], bool], strategy):
        self.flag, self.strategy = flag, strategy
        self.reason = ANOTHER_RANK

    def _mine(self) -> str:
        return getattr(self.flag, "reason", "stopped by user")

    def __call__(self) -> bool:
        agreed = self.strategy.agree_stop(reason_code(self._mine()) if self.flag() else 0)
        # asked after the collective: a stop request set in between is this rank's own too
        if agreed:
            self.reason = self._mine() if self.flag() else agreed_reason(agreed)
        return bool(agreed)
