"""Which rank is slow, in what, and how long the others waited for it.

A collective evens out the ranks' step times: the rank that is slow in backward makes every
other rank wait in its all-reduce (ddp) or reduce-scatter (fsdp), so their steps take as long
as its. What is not evened out is each rank's *own* work on a metered step, recorded before
any collective (``gputui.core.events.DeviceStep``): its data wait, its forward and its backward
up to its last gradient (the collectives inside them left out), and its update. From the
ranks' rows of one step:

- the **slowest rank** is the one whose own work (the four phases) took longest;
- its **phase** is the one in which it exceeded the others' median the most;
- its **lag** is how much longer its own work took than the others' median;
- the **wait** the others paid is how much longer each sat in exposed communication than the
  slowest rank did (communication that was not waiting costs every rank alike), mean over
  the others. Where a rank's exposed communication is not measured, its idle time (its step
  less its own work) stands in.

Torch-free: the printer, the run screen, compare and the waterfall read it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any, Iterable

PHASES = ("data", "forward", "backward", "optimizer")
SIGNIFICANT = 0.05  # a wait from this share of the step up names a straggler
MIN_WAIT_S = 0.0005  # ... and of at least half a millisecond


@dataclass(frozen=True)
class Straggler:
    """The slowest rank of a metered step (or of a run's steps: ``over_steps``)."""

    rank: int | None  # its global rank (None: a row without one)
    device: str  # its device, as the rows name it
    phase: str  # one of PHASES: where it lost the most against the others
    lag_s: float  # its own work's seconds beyond the others' median
    wait_s: float  # seconds each other rank waited for it (mean over the others)
    step_s: float  # the step's seconds (mean over the ranks)
    ranks: int  # ranks measured
    steps: int = 1  # metered steps summarised
    agree: float = 1.0  # the share of those steps in which this rank was the slowest

    @property
    def mean_wait_s(self) -> float:
        """The wait spread over every rank (the slowest waits for no one): the part of the
        mean rank's step lost to the straggler."""
        return self.wait_s * (self.ranks - 1) / self.ranks if self.ranks else 0.0

    def significant(self) -> bool:
        """Whether the others' wait is big enough to name a straggler (not noise)."""
        return self.wait_s >= max(MIN_WAIT_S, SIGNIFICANT * self.step_s)

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), significant=self.significant())


def phases(row: Any) -> dict[str, float] | None:
    """A rank's own seconds per phase on its metered step (None: not measured per phase)."""
    bd = getattr(row, "breakdown", None)
    forward = getattr(row, "forward_s", None)
    if bd is None or forward is None:
        return None
    return {"data": bd.data_s, "forward": forward, "backward": row.backward_s or 0.0,
            "optimizer": bd.optimizer_s}


def _idle(row: Any, own: float) -> float:
    exposed = row.breakdown.comm_exposed_s
    return exposed if exposed is not None else max(0.0, row.breakdown.step_s - own)


def find(rows: Iterable[Any]) -> Straggler | None:
    """The slowest rank of one metered step, from its ranks' rows (``DeviceStep``); None
    where fewer than two ranks measured their phases."""
    measured = [(r, p) for r in rows if (p := phases(r)) is not None]
    if len(measured) < 2:
        return None
    own = [sum(p.values()) for _, p in measured]
    slow = max(range(len(measured)), key=lambda i: own[i])
    row, mine = measured[slow]
    others = [i for i in range(len(measured)) if i != slow]
    excess = {ph: mine[ph] - median(measured[i][1][ph] for i in others) for ph in PHASES}
    idle = _idle(row, own[slow])
    wait = sum(max(0.0, _idle(measured[i][0], own[i]) - idle) for i in others) / len(others)
    step = sum(r.breakdown.step_s for r, _ in measured) / len(measured)
    return Straggler(rank=row.rank, device=row.device, phase=max(PHASES, key=excess.__getitem__),
                     lag_s=max(0.0, own[slow] - median(own[i] for i in others)), wait_s=wait,
                     step_s=step, ranks=len(measured))


def over_steps(steps: list[Straggler]) -> Straggler | None:
    """A run's straggler from its metered steps' (the first, warm-up, left out when there
    are more): the rank most often the slowest, its most frequent phase, and the mean lag,
    wait and step over every step (a step where another rank was slowest adds its wait too:
    the others waited all the same)."""
    steps = steps[1:] if len(steps) > 1 else steps
    if not steps:
        return None
    count = Counter((s.rank, s.device) for s in steps)
    (rank, device), n = count.most_common(1)[0]
    mine = [s for s in steps if (s.rank, s.device) == (rank, device)]
    phase = Counter(s.phase for s in mine).most_common(1)[0][0]

    def avg(key: str) -> float:
        return sum(getattr(s, key) for s in steps) / len(steps)

    return Straggler(rank=rank, device=device, phase=phase, lag_s=avg("lag_s"),
                     wait_s=avg("wait_s"), step_s=avg("step_s"), ranks=steps[0].ranks,
                     steps=len(steps), agree=n / len(steps))


def line(s: Straggler | None) -> str | None:
    """One line: 'straggler: rank 1 (cpu:1), in backward: +201.3 ms of its own work; the
    other rank waited 198.7 ms for it (45% of the step)'; None without one."""
    if s is None:
        return None
    who = f"rank {s.rank} ({s.device})" if s.rank is not None else s.device
    others = "the other rank" if s.ranks == 2 else f"the other {s.ranks - 1} ranks"
    share = f"{s.wait_s / s.step_s:.0%} of the step" if s.step_s else "no step measured"
    steps = f"; slowest in {s.agree:.0%} of {s.steps} metered steps" if s.steps > 1 else ""
    if not s.significant():
        return (f"ranks even: the slowest, {who}, took {1000 * s.lag_s:.1f} ms more "
                f"({s.phase}); {others} waited {1000 * s.wait_s:.1f} ms ({share}){steps}")
    return (f"straggler: {who}, in {s.phase}: +{1000 * s.lag_s:.1f} ms of its own work; "
            f"{others} waited {1000 * s.wait_s:.1f} ms for it ({share}){steps}")
