"""The signals that end a run: SIGINT (Ctrl-C), SIGTERM (timeout, systemd, docker stop, a
SLURM preemption or ``scancel``), SIGHUP (a closed terminal, an SSH drop, ``tmux
kill-session``) and SIGUSR1 (SLURM's ``--signal=USR1@SECONDS`` before the time limit).

Each of them, reaching gputui and its training processes (a terminal signals the whole process
group; systemd and SLURM signal every process of the job), becomes the graceful stop: the
ranks agree on a step, a checkpoint is written and the record ends ``run_stopped`` naming the
signal. The parent turns a second signal, or a stop that outlasts ``run.stop_grace_s``, into
the kill, and the record still ends.

Training processes (:func:`watch`) block the stop signals and take them in a thread with
``sigwaitinfo``: nothing can interrupt a step or a checkpoint half-way (torch's elastic agent
installs handlers that raise in its main thread; blocked signals never reach them), and the
sender is known, so a rank can tell torch's own teardown (SIGTERM from its agent) from a stop.
The parent (:class:`Supervisor`) notes the signals in a handler and acts in its poll loop.
The whole stop path, from here to the step the ranks agree on, is told in ``stopping.py``.

One stop contract for every headless command that trains (run, resume, sweep, verify, tune,
predict's measuring, bench-comm; docs/failures.md): the command line installs one process-wide
Supervisor before it imports its command families (:func:`take_over`), so no signal lands
where nothing takes it; every run handle asks it at each poll (``launcher``), so the first
signal stops whatever runs, and no new run or measurement starts once one came
(:func:`raise_if_stopped` raises :class:`Interrupted`). The command prints what it has, says in
one line what was kept, and exits 128 + the signal.
Torch-free: the CLI and the app use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Iterator

# SIGUSR1: the warning a batch system sends before a job's time limit (SLURM's
# `--signal=USR1@90`, Lightning's requeue signal): its default action would kill the run
# mid-step, so it is the same graceful stop (docs/clusters.md)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
_WORDS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGHUP: "SIGHUP (the terminal closed)",
          signal.SIGUSR1: "SIGUSR1 (a batch system's time-limit warning)"}


def describe(signum: int) -> str:
    """The signal's name, with what usually sends it where that helps."""
    sig = signal.Signals(signum)
    return _WORDS.get(sig, sig.name)


def stop_reason(signum: int) -> str:
    """The reason a stop by this signal leaves in the record."""
    return f"stopped by {describe(signum)}"


def detach_output() -> None:
    """The terminal is gone: send stdout and stderr to /dev/null so writing never fails
    (a write to a hung-up terminal raises EIO)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


NOHUP_ENV = "GPUTUI_NOHUP"  # "1": the command was started with SIGHUP ignored (nohup)


def nohup(sig: int) -> bool:
    """``sig`` is SIGHUP and the command was started with it ignored (`nohup gputui run ...
    &`, to outlive the terminal): the one inherited ignore gputui keeps, in every process of
    the run (told to them in :data:`NOHUP_ENV`: a process between them, torch's elastic
    agent, handles SIGHUP, so its children start with the default). SIGINT ignored by a
    shell's background job is taken all the same: a Ctrl-C sent to it still stops."""
    return sig == signal.SIGHUP and (signal.getsignal(sig) == signal.SIG_IGN
                                     or os.environ.get(NOHUP_ENV) == "1")


def watch(on_signal: Callable[[int, int], None]) -> None:
    """Training-process side: block the stop signals in this process and call
    ``on_signal(signum, sender_pid)`` for each from a daemon thread (sender 0: the kernel, e.g.
    a terminal's Ctrl-C or hang-up). Call from the main thread before any other thread starts
    (threads inherit the mask; so do processes started later, which then hold the signals
    pending until they watch them too)."""
    for sig in STOP_SIGNALS:
        if nohup(sig):  # a hang-up the command was started to ignore: never queued
            signal.signal(sig, signal.SIG_IGN)
            continue
        if signal.getsignal(sig) == signal.SIG_IGN:  # an ignored signal is never queued
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def loop() -> None:
        while True:
            info = signal.sigwaitinfo(STOP_SIGNALS)
            if nohup(info.si_signo):  # queued all the same where a handler came after
                continue              # (torch's elastic agent's): still nohup's to ignore
            if info.si_signo == signal.SIGHUP:
                detach_output()
            try:
                on_signal(info.si_signo, info.si_pid)
            except Exception:  # noqa: BLE001 - the next signal must still be taken
                pass

    threading.Thread(target=loop, name="gputui-signals", daemon=True).start()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold the stop signals back in this thread while it starts a training process: the
    process inherits them blocked, so a signal that reaches it while it starts up (a group's
    Ctrl-C in its first moments) waits, pending, until it takes them (:func:`watch`, its first
    act) and becomes the graceful stop, never a KeyboardInterrupt in the middle of its imports.
    A signal reaching this process meanwhile is handled when the block ends. Start
    multiprocessing's resource tracker before (a queue does): starting it unblocks SIGINT and
    SIGTERM in the calling thread (CPython 3.11's ``ensure_running``)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def hold() -> None:
    """A measuring process (bench-comm's, predict's collectives: started under
    :func:`deferred`): the stop signals stay held for its whole life, so neither Python's nor
    torch's handlers (its elastic agent installs some) ever act on one; the parent, which took
    the signal too, decides, and ends it with its processes (the stop contract)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def rank_of_held() -> None:
    """A rank below a :func:`hold` process: SIGTERM let through again, so torch's own teardown
    of a failed launch (SIGTERM to the ranks left) still ends it; SIGINT and SIGHUP stay held."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])


def die_by(signum: int) -> None:
    """End this process as the signal's default action would (from any thread): what a rank
    does with torch's own teardown, so the agent sees the exit code it expects."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    time.sleep(5)
    os._exit(128 + signum)


class Supervisor:
    """Parent side (a headless command): note the stop signals, and turn them into the run's
    graceful stop, then the kill (a second signal, or the stop outlasting ``grace_s``)."""

    def __init__(self, grace_s: float = 30.0):
        self.grace_s = grace_s
        self.received: list[int] = []
        self._acted = 0
        self._stop_asked_at: float | None = None
        self._previous: dict[int, object] = {}
        # what the stop and the kill say, from the thread that polls (a command sets its own)
        self.say: Callable[[str], None] = _say

    def install(self) -> "Supervisor":
        """Take the stop signals in this process (main thread) until :meth:`uninstall`; the
        process-wide Supervisor (:func:`active`) from then on."""
        global _ACTIVE
        for sig in STOP_SIGNALS:
            if not nohup(sig):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        global _ACTIVE
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
        if _ACTIVE is self:
            _ACTIVE = None

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGHUP:
            detach_output()
        if self.received[self._acted:] and self.received[-1] == signum:
            # The same signal again before this process acted on the first: one request
            # delivered twice (GNU timeout signals gputui, then its whole group), not a second.
            return
        self.received.append(signum)

    @property
    def first(self) -> int | None:
        """The first stop signal received, if any."""
        return self.received[0] if self.received else None

    def check(self, handle, say: Callable[[str], None]) -> None:
        """Act on the signals received since the last call (from the poll loop)."""
        while self._acted < len(self.received):
            signum = self.received[self._acted]
            self._acted += 1
            if self._acted == 1:
                handle.stop(stop_reason(signum))
                self._stop_asked_at = time.monotonic()
                say(f"{describe(signum)}: stopping at the next step "
                    f"(a second signal kills the run)")
            elif self._acted == 2:
                handle.kill(f"killed by a second signal ({describe(signum)})")
                say("killing the run")
        asked = self._stop_asked_at
        if asked is not None and self._acted < 2 and time.monotonic() - asked > self.grace_s:
            self._acted = 2
            handle.kill(f"killed: the stop asked by {describe(self.received[0])} did not end "
                        f"within {self.grace_s:g} s (run.stop_grace_s)")
            say(f"the run did not stop within {self.grace_s:g} s: killing it")

    def exit_code(self) -> int | None:
        """128 + the first signal's number (130 for Ctrl-C), or None when none came."""
        return 128 + self.first if self.first else None


class Interrupted(Exception):
    """A stop signal came before (or between) a command's runs or measurements: nothing more
    starts. ``signum`` is the first signal; ``exit_code`` 128 + it."""

    def __init__(self, signum: int):
        super().__init__(stop_reason(signum))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_ACTIVE: Supervisor | None = None

# the stop signals noted for the app between the command line's handlers and its own (the
# terminal is in the app's mode by then: a signal's default action would leave it broken)
NOTED_FOR_APP: list[int] = []


def note_for_app(signum: int, frame: object = None) -> None:
    """A handler: the signal noted for the app, which acts on it once it takes the signals."""
    if signum not in NOTED_FOR_APP:
        NOTED_FOR_APP.append(signum)


def hand_to_app(came: list[int]) -> None:
    """The stop signals noted (``came``: those that came already) until the app's own
    handlers take them (main thread only; elsewhere they stay as they are)."""
    for signum in came:
        note_for_app(signum)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if not nohup(sig):
                signal.signal(sig, note_for_app)
    except ValueError:
        pass


def _say(text: str) -> None:
    import sys

    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a terminal that hung up: the stop goes on unsaid
        pass


def active() -> Supervisor | None:
    """The process-wide Supervisor a headless command installed, or None (the app, a script
    using gputui as a library: their own handling stands)."""
    return _ACTIVE


def take_over(grace_s: float = 30.0, received: list[int] | tuple[int, ...] = ()) -> Supervisor:
    """The process-wide Supervisor, installed now (main thread) unless one is: a command's
    first act, so a signal is noted wherever it lands. ``received``: signals noted before it
    (while the command line loaded)."""
    sup = _ACTIVE or Supervisor(grace_s).install()
    for signum in received:
        if signum not in sup.received:
            sup.received.append(signum)
    return sup


def stopped() -> int | None:
    """The first stop signal the process-wide Supervisor received, or None."""
    sup = _ACTIVE
    return sup.first if sup is not None else None


def raise_if_stopped() -> None:
    """Raise :class:`Interrupted` when a stop signal came: a command starts nothing after it."""
    signum = stopped()
    if signum is not None:
        raise Interrupted(signum)


def supervise(target) -> None:
    """Act on the signals received (the stop, then the kill) for ``target`` (what has
    ``stop(reason)`` and ``kill(reason)``: the live runs); no-op without a process-wide
    Supervisor. Called from the thread that polls the runs."""
    sup = _ACTIVE
    if sup is not None:
        sup.check(target, sup.say)
