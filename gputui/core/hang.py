"""A hang named: each rank's collectives counted, and the rank a stalled job waits for.

Every rank of a multi-process run counts the collectives it issues (kind, sequence number,
bytes) as it enters and leaves them, in its row (its global rank's) of a small shared table of
numbers that its node's run host reads (:class:`Ledger`; written in the rank by
``gputui.train.collectives``, read in the host by ``gputui.train.agent``). Nothing crosses a
queue or a lock: a row is a few float64 stores per collective, and the host reads them every
half second. On several nodes each rank also publishes its row through the job's c10d store
every second, and each node's first rank copies the other nodes' rows into its table, so
every node's host sees every rank (the others' as of their last publication).

When no rank's row has moved for the stall threshold (:func:`threshold`) while some rank is
inside a collective, :func:`diagnose` says which rank is behind and where: the rank that is
not inside the collective the others wait in ("rank 1 never entered all-reduce #212 of step
54; rank 0 waited 12 s"), else the rank furthest behind in the sequence, else a rank whose
process is stopped or gone. Pure functions over snapshots; torch-free.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, MutableSequence, Sequence

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "barrier", "send", "recv",
         "all-to-all", "gather", "scatter", "reduce", "collective")
# one row per local rank: its fields, in order
FIELDS = ("rank", "pid", "step", "entered", "left", "kind", "bytes", "t_enter", "t_left",
          "dump", "t_step", "local", "beat", "heard")
WIDTH = len(FIELDS)
_AT = {name: i for i, name in enumerate(FIELDS)}
P2P_MATE = {"recv": "sent", "send": "received"}  # what the peer of a waiting p2p never did
FLOOR_S = 60.0  # the default threshold is never below this
STEPS = 20.0  # ... and at least this many of the run's slowest logged steps
# another node's rank whose publisher (every second, gputui.train.collectives) has not been
# heard from for this long is silent: its process is stopped, dead or cut off from this node
SILENT_S = 3.0


class Ledger:
    """The shared table: ``rows`` local ranks of ``WIDTH`` float64s over ``cells`` (a
    ``multiprocessing`` RawArray('d') made by the host, or a list in a test). A row's writer
    is its rank alone (``dump``: the host's request to that rank, see ``ask_dump``)."""

    def __init__(self, cells: MutableSequence[float], rows: int | None = None):
        self.cells = cells
        self.rows = len(cells) // WIDTH if rows is None else rows

    @classmethod
    def size(cls, rows: int) -> int:
        """How many cells ``rows`` ranks need."""
        return rows * WIDTH

    def get(self, row: int, name: str) -> float:
        return float(self.cells[row * WIDTH + _AT[name]])

    def set(self, row: int, name: str, value: float) -> None:
        self.cells[row * WIDTH + _AT[name]] = value

    def join(self, row: int, rank: int, pid: int) -> None:
        """A rank takes its row (its global rank and pid; nothing entered yet)."""
        now = time.time()
        for name, value in (("rank", rank), ("pid", pid), ("t_enter", now), ("t_left", now),
                            ("t_step", now), ("local", 1)):
            self.set(row, name, value)

    def row(self, row: int) -> list[float]:
        """A row's cells (what a rank publishes to the other nodes)."""
        return [float(v) for v in self.cells[row * WIDTH:(row + 1) * WIDTH]]

    def put_remote(self, row: int, values: Sequence[float]) -> None:
        """Another node's rank's row, as it published it (never over a local rank's row);
        ``heard`` is when this node last got a new publication of it (its ``beat`` moved:
        a rank waiting in a collective publishes the same counts, but a new beat)."""
        if self.get(row, "local") == 1.0 or len(values) != WIDTH:
            return
        beat, heard = self.get(row, "beat"), self.get(row, "heard")
        for i, value in enumerate(values):
            self.cells[row * WIDTH + i] = value
        self.set(row, "local", 0)
        self.set(row, "dump", 0)
        self.set(row, "heard", time.time() if values[_AT["beat"]] != beat else heard)

    def beat(self, row: int) -> None:
        """A rank's publisher is alive: its row's beat moves on (see put_remote)."""
        self.set(row, "beat", self.get(row, "beat") + 1)

    def snapshot(self) -> tuple[RankState, ...]:
        """Every row that a rank has joined, as plain values."""
        out = []
        for row in range(self.rows):
            if not self.get(row, "pid"):
                continue
            kind = int(self.get(row, "kind"))
            out.append(RankState(
                rank=int(self.get(row, "rank")), pid=int(self.get(row, "pid")),
                step=int(self.get(row, "step")), entered=int(self.get(row, "entered")),
                left=int(self.get(row, "left")),
                kind=KINDS[kind] if 0 <= kind < len(KINDS) else "collective",
                nbytes=int(self.get(row, "bytes")), t_enter=self.get(row, "t_enter"),
                t_left=self.get(row, "t_left"), t_step=self.get(row, "t_step"),
                local=self.get(row, "local") == 1.0, heard=self.get(row, "heard")))
        return tuple(out)

    def unheard(self, states: Sequence[RankState]) -> tuple[RankState, ...]:
        """``states`` and a state for every rank of the job that never reported to this
        node (a rank of another node frozen or dead before its first publication): a
        multi-node job's host adds them, so such a rank is named too."""
        seen = {s.rank for s in states}
        return tuple(states) + tuple(
            RankState(rank=r, pid=0, step=-1, entered=0, left=0, kind="collective", nbytes=0,
                      t_enter=0.0, t_left=0.0, local=False)
            for r in range(self.rows) if r not in seen)

    def ask_dump(self) -> None:
        """Ask every rank for torch's own trace of its collectives (the flight recorder),
        where this torch keeps one (``gputui.train.collectives``)."""
        for row in range(self.rows):
            if self.get(row, "local") == 1.0:
                self.set(row, "dump", 1.0)


@dataclass(frozen=True)
class RankState:
    """One rank's collectives as its row says: ``entered`` and ``left`` count them (the one
    in flight is number ``entered``, of ``kind`` and ``nbytes``), ``step`` is the training
    step it is in, ``t_enter``/``t_left`` when it last entered/left one."""

    rank: int
    pid: int
    step: int
    entered: int
    left: int
    kind: str
    nbytes: int
    t_enter: float
    t_left: float
    t_step: float = 0.0  # when it began its current step
    local: bool = True  # a rank of this node (else another node's, as last published)
    process: str = ""  # "stopped", "gone", ... when the host looked at its process
    heard: float = 0.0  # another node's rank: when its last publication reached this node

    @property
    def inside(self) -> bool:
        """Inside a collective (entered one it has not left)."""
        return self.entered > self.left

    @property
    def moved(self) -> float:
        """When its row last changed (a collective entered or left, a step begun)."""
        return max(self.t_enter, self.t_left, self.t_step)


@dataclass(frozen=True)
class Stall:
    """What a stalled job waits for: ``behind`` (the ranks named), the collective they never
    entered (or are stuck in), the step, how long the waiting ranks waited; ``message`` says
    it in one line."""

    behind: tuple[int, ...]
    waiting: tuple[int, ...]
    kind: str
    seq: int
    step: int
    waited_s: float
    message: str


def threshold(flag: float, step_times: Sequence[float] = (), eval_times: Sequence[float] = ()
              ) -> float | None:
    """Seconds without progress that make a stall: the flag when given (> 0), none when it
    is -1, else STEPS times the slowest logged step (and 3 x the slowest evaluation), at least
    FLOOR_S."""
    if flag > 0:
        return flag
    if flag < 0:
        return None
    slowest = max([t for t in step_times if math.isfinite(t)] or [0.0])
    evals = max([t for t in eval_times if math.isfinite(t)] or [0.0])
    return max(FLOOR_S, STEPS * slowest, 3 * evals)


def _ranks(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2, 5'."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(str(r) for r in rs)


def _was(ranks: Sequence[int]) -> str:
    return "was" if len(ranks) == 1 else "were"


def diagnose(states: Sequence[RankState], stall_s: float, now: float | None = None
             ) -> Stall | None:
    """The stall, when no rank has moved for ``stall_s`` and some rank waits in a collective;
    None otherwise (the job moves, or nobody waits: a long step of compute is no hang)."""
    now = time.time() if now is None else now
    if not states or any(now - s.moved < stall_s for s in states):
        return None
    local = [s for s in states if s.local]
    if local and all(s.process == "gone" for s in local):
        return None  # this node's ranks have exited: the job is ending (its agent says why)
    waiting = [s for s in states if s.inside]
    silent = [s for s in states if not s.local and now - s.heard > SILENT_S]
    if silent and any(s.local and s.process for s in states):
        # a rank of this node is stopped or gone: it explains the silence (the other nodes'
        # reports reach this node through its first rank), and their stale counts say nothing
        states = [s for s in states if s not in silent]
        waiting = [s for s in states if s.inside]
    elif silent:  # another node's rank stopped reporting: its counts are stale, it is the one
        return _silent(states, silent, now)
    if not waiting:  # nobody waits in a counted collective: a hang only if a process stopped
        return _stopped(states, now)
    # the collective the waiting ranks are in: the furthest one along
    front = max(waiting, key=lambda s: s.entered)
    seq, kind, step = front.entered, front.kind, front.step
    waited = now - min(s.t_enter for s in waiting)
    waiters = sorted(s.rank for s in waiting)
    outside = [s for s in states if not s.inside]
    if outside:  # never entered: its last collective is behind the others' current one
        behind = sorted(s.rank for s in outside)
        why = _process_note(outside)
        if kind in P2P_MATE:  # a send's peer does not enter a send: it never received
            message = (f"{_ranks(waiters)} waited {waited:.0f} s in {kind} #{seq} of step "
                       f"{step} for {_ranks(behind)}{why}, which never {P2P_MATE[kind]}")
        else:
            message = (f"{_ranks(behind)} never entered {kind} #{seq} of step {step}{why}; "
                       f"{_ranks(waiters)} waited {waited:.0f} s")
        return Stall(tuple(behind), tuple(waiters), kind, seq, step, waited, message)
    late = [s for s in waiting if s.entered < seq]
    if late:  # inside an earlier collective than the others
        behind = sorted(s.rank for s in late)
        ahead = sorted(s.rank for s in waiting if s.entered == seq)
        waited = now - min(s.t_enter for s in waiting if s.entered == seq)
        first = min(late, key=lambda s: s.entered)
        message = (f"{_ranks(behind)} {_was(behind)} still in {first.kind} #{first.entered} "
                   f"of step {first.step}{_process_note(late)} while {_ranks(ahead)} waited "
                   f"{waited:.0f} s in {kind} #{seq}")
        return Stall(tuple(behind), tuple(ahead), kind, seq, step, waited, message)
    odd = [s for s in waiting if s.process]
    if odd:  # every rank entered the same collective; a process of them no longer runs
        behind = sorted(s.rank for s in odd)
        others = sorted(s.rank for s in waiting if not s.process)
        waited = now - min([s.t_enter for s in waiting if not s.process] or [now])
        message = (f"{_ranks(behind)} entered {kind} #{seq} of step {step} but "
                   f"{_process_note(odd)[2:-1]}"
                   + (f"; {_ranks(others)} waited {waited:.0f} s" if others else ""))
        return Stall(tuple(behind), tuple(others), kind, seq, step, waited, message)
    message = (f"every rank seen here is inside {kind} #{seq} of step {step} and none left it "
               f"for {waited:.0f} s: the collective itself hangs (a rank on another node, "
               f"the network, or the backend)")
    return Stall((), tuple(waiters), kind, seq, step, waited, message)


def _silent(states: Sequence[RankState], silent: Sequence[RankState], now: float) -> Stall:
    """Ranks of another node that stopped reporting (their publisher runs beside their
    training, so only a stopped, dead or cut-off process goes quiet): named, with where they
    were last heard of and what the ranks here wait in."""
    behind = sorted(s.rank for s in silent)
    heard = [s for s in silent if s.heard]
    if heard:
        last = min(heard, key=lambda s: s.step)
        quiet = now - max(s.heard for s in heard)
        said = (f"{_ranks(behind)} on another node went silent {quiet:.0f} s ago (last heard "
                f"of in step {last.step}): its process stopped, died or lost this node")
    else:
        said = (f"{_ranks(behind)} on another node never reported to this node: its process "
                f"stopped, died or lost this node before its first report")
    here = [s for s in states if s not in silent]
    waiting = [s for s in here if s.inside]
    if waiting:
        front = max(waiting, key=lambda s: s.entered)
        waited = now - min(s.t_enter for s in waiting)
        message = (f"{said}; {_ranks([s.rank for s in waiting])} waited {waited:.0f} s in "
                   f"{front.kind} #{front.entered} of step {front.step}")
        return Stall(tuple(behind), tuple(sorted(s.rank for s in waiting)), front.kind,
                     front.entered, front.step, waited, message)
    still = now - max([s.moved for s in here] or [now])
    message = said + (f"; {_ranks([s.rank for s in here])} made no progress for {still:.0f} s"
                      if here else "")
    return Stall(tuple(behind), tuple(sorted(s.rank for s in here)), "collective", 0,
                 max([s.step for s in here] or [0]), still, message)


def _stopped(states: Sequence[RankState], now: float) -> Stall | None:
    """No rank waits in a collective gputui counts (tensor parallelism's are not counted),
    none moved, and some rank's process is stopped or gone: that rank is named."""
    odd = [s for s in states if s.process]
    if not odd:
        return None  # a long step of compute is no hang
    behind = sorted(s.rank for s in odd)
    first = min(odd, key=lambda s: s.step)
    others = sorted(s.rank for s in states if not s.process)
    still = now - max(s.moved for s in states)
    message = (f"{_ranks(behind)} stopped in step {first.step}{_process_note(odd)}"
               + (f"; {_ranks(others)} made no progress for {still:.0f} s" if others else ""))
    return Stall(tuple(behind), tuple(others), first.kind, first.entered, first.step, still,
                 message)


def _process_note(states: Sequence[RankState]) -> str:
    """' (its process, pid 12, is stopped)' for the named ranks whose process the host found
    not running."""
    notes = [f"pid {s.pid}, is {s.process}" for s in states if s.process]
    return f" (its process, {'; '.join(notes)})" if notes else ""


def states_with(states: Sequence[RankState], process: dict[int, str]) -> tuple[RankState, ...]:
    """The states with what the host saw of each rank's process (pid -> "stopped", ...)."""
    return tuple(replace(s, process=process.get(s.pid, "")) for s in states)


def rows(states: Sequence[RankState]) -> tuple[dict[str, Any], ...]:
    """Every rank's row, JSON-ready (the record's Stalled event keeps them)."""
    return tuple({"rank": s.rank, "pid": s.pid, "step": s.step, "entered": s.entered,
                  "left": s.left, "kind": s.kind, "bytes": s.nbytes, "process": s.process,
                  "local": s.local, "heard": s.heard} for s in states)
