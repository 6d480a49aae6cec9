"""The scaling waterfall: from the ideal N x speedup to the measured one, cause by cause.

A run on N devices against its one-device baseline would, scaled perfectly, run N times as
many samples per second: every part of its step would shrink with the work per device, so
its step would have the baseline's shares. What it measures instead is speedup S. Write the
run's step T as the ideal step T* = T x S / N plus, for each cause c, the time t_c it took
beyond its ideal-scaled part (b_c / T_B of T*, b_c the baseline's), plus a remainder:

    T = T* + sum_c (t_c - T* b_c / T_B) + r

Divided by T and multiplied by N this is, exactly,

    N - S = sum_c (N t_c / T  -  S b_c / T_B)  +  N r / T

so each cause's bar, in speedup units (x), is ``N x its share of the run's step - S x its
share of the baseline's``, and what no cause explains (the run's compute scaling worse than
N, or a cause not measured) is the remainder ``N - S - sum of the bars``: the bars add up to
the measured speedup by construction. A bar is negative where the run spent a smaller share
on a cause than its baseline did (shown as it is, as is a negative remainder).

The causes, each a share of the step of the mean rank (``gputui.core.breakdown``):
exposed communication (less the part of it spent waiting for a straggler), the straggler
wait (``gputui.core.straggler``), the pipeline bubble (pp's stages idle waiting on each
other), devices one process drives in turn (scratch / model_parallel on CPU virtual
devices), data loading, host overhead, and contention (the share of the machine's cores
other processes held while the run ran, ``machine.json``: an estimate, for a run that wanted
every core; on GPUs only the CPU side). Torch-free and pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gputui.core.breakdown import Breakdown
from gputui.core.straggler import Straggler

CAUSES = ("comm", "straggler", "bubble", "turns", "data", "host", "contention")
LABELS = {"comm": "exposed communication", "straggler": "waiting for a straggler",
          "bubble": "pipeline bubble", "turns": "devices taking turns",
          "data": "data loading", "host": "host overhead",
          "contention": "contention (other processes)", "unexplained": "unexplained"}


@dataclass(frozen=True)
class Shares:
    """A run's step, as the share of it each cause took (0..1; see the module doc)."""

    comm: float = 0.0
    straggler: float = 0.0
    bubble: float = 0.0
    turns: float = 0.0
    data: float = 0.0
    host: float = 0.0
    contention: float = 0.0


def shares(bd: Breakdown | None, slow: Straggler | None = None, pipeline: bool = False,
           contention: float | None = None) -> Shares:
    """The causes' shares of a run's mean metered step: ``bd`` its breakdown (mean over
    ranks and steps), ``slow`` its straggler (its wait, spread over the ranks, is taken out
    of exposed comm, where the others sat), ``pipeline``: the wait part is pp's bubble
    (else devices driven in turn), ``contention``: other processes' share of the cores."""
    other = max(0.0, min(1.0, contention or 0.0))
    if bd is None or not bd.step_s:
        return Shares(contention=other)
    step = bd.step_s
    wait = min(slow.mean_wait_s if slow is not None else 0.0, bd.comm_exposed_s or 0.0)
    exposed = max(0.0, (bd.comm_exposed_s or 0.0) - wait)
    return Shares(comm=exposed / step, straggler=wait / step,
                  bubble=bd.wait_s / step if pipeline else 0.0,
                  turns=0.0 if pipeline else bd.wait_s / step,
                  data=bd.data_s / step, host=bd.host_s / step, contention=other)


@dataclass(frozen=True)
class Waterfall:
    """The ideal speedup, what each cause took away (x, positive = lost) and the measured
    speedup; ``bars`` hold every cause and then "unexplained", and add up to
    ``ideal - measured``."""

    ideal: float
    measured: float
    bars: tuple[tuple[str, float], ...]
    # the run's collectives by name (seconds a metered step, gputui.runs.compare.table): what the
    # communication bar was made of
    comm_kinds: dict | None = None

    def lost(self, cause: str) -> float:
        return dict(self.bars)[cause]

    def to_dict(self) -> dict[str, Any]:
        return {"ideal": self.ideal, "measured": self.measured,
                "bars": [{"cause": c, "label": LABELS[c], "lost": v} for c, v in self.bars],
                "comm_kinds": self.comm_kinds}


def build(ideal: float, measured: float, run: Shares, base: Shares | None = None) -> Waterfall:
    """The waterfall of a run of speedup ``measured`` on ``ideal`` times its baseline's
    devices, from its causes' shares and its baseline's (see the module doc)."""
    base = base or Shares()
    bars = [(c, ideal * getattr(run, c) - measured * getattr(base, c)) for c in CAUSES]
    rest = ideal - measured - sum(v for _, v in bars)
    return Waterfall(ideal=ideal, measured=measured, bars=(*bars, ("unexplained", rest)))


def lines(wf: Waterfall, width: int = 40, title: str = "") -> list[str]:
    """The waterfall as text: the ideal, each cause's loss (a bar from where the previous
    left off; '+' where a cause gave back more than its baseline's share), the measured."""
    levels, level = [wf.ideal, wf.measured], wf.ideal
    for _, lost in wf.bars:
        level -= lost
        levels.append(level)
    scale = width / max(1e-9, *levels)
    out = [title] if title else []
    out.append(f"  {'ideal':<30} {wf.ideal:6.2f}x  {'█' * round(wf.ideal * scale)}")
    level = wf.ideal
    for cause, lost in wf.bars:
        if abs(lost) < 0.005 and cause != "unexplained":
            continue  # a cause that took nothing measurable
        low, high = sorted((max(0.0, level), max(0.0, level - lost)))
        glyph = "▒" if lost >= 0 else "+"
        bar = " " * round(low * scale) + glyph * max(1, round((high - low) * scale))
        out.append(f"  {LABELS[cause]:<30} {-lost:+6.2f}x  {bar}")
        if cause == "comm" and wf.comm_kinds:
            total = sum(wf.comm_kinds.values()) or 1.0
            out.append("    of which " + " · ".join(f"{kind} {100 * v / total:.0f}%"
                                                    for kind, v in wf.comm_kinds.items()))
        level -= lost
    out.append(f"  {'measured':<30} {wf.measured:6.2f}x  {'█' * round(wf.measured * scale)}")
    return out


def for_run(row: Any, measured: float, bd: Breakdown | None, slow: Straggler | None,
            base_row: Any, base_bd: Breakdown | None,
            pipeline: bool | None = None) -> Waterfall | None:
    """A compared run's waterfall against its baseline (``RunRow``s, their mean breakdowns,
    the run's straggler); None without a breakdown of the run. ``pipeline``: the run's
    stages reported a bubble (pp, or a mesh with pp; default: its strategy is pp)."""
    if bd is None or not row.devices or not base_row.devices:
        return None

    def contention(r: Any) -> float | None:
        return (r.machine or {}).get("others_share") if r.machine else None

    pp = row.strategy == "pp" if pipeline is None else pipeline
    return build(row.devices / base_row.devices, measured,
                 shares(bd, slow, pp, contention(row)),
                 shares(base_bd, None, base_row.strategy == "pp", contention(base_row)))
