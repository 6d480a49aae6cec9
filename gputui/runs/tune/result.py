"""What ``gputui tune`` found: predicted against measured per candidate, the choice, and the
preset of the chosen configuration.

The measured figure of a confirming run is its steady-state samples/s (warm-up excluded,
:mod:`gputui.core.steady`), read through :func:`gputui.runs.compare.table.compare`, so its speedup
follows compare's baseline rules and flags (:mod:`gputui.core.trust`). A figure is marked
*contended* when other processes used the machine while it ran, *noisy* when its noise is
above ``trust.NOISY`` or unknown (too few steady windows); the choice says when it rests on
such a figure, and when the runner-up is within the noise of it. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gputui.core import machine
from gputui.core.trust import MIN_NOISE, NOISY
from gputui.runs.tune.space import Ranked
from gputui.runs.compare.table import compare

COLUMNS = ("chosen", "rank", "candidate", "pred_step_ms", "pred_samples_per_s",
           "samples_per_s", "measured_vs_pred", "speedup", "check")
HEADERS = {"chosen": "", "rank": "#", "pred_step_ms": "predicted step", "candidate":
           "configuration", "pred_samples_per_s": "predicted samples/s",
           "samples_per_s": "measured samples/s", "measured_vs_pred": "measured/predicted"}


@dataclass
class Result:
    """One candidate: its prediction and, once confirmed, its measured figure."""

    ranked: Ranked
    rank: int
    run_id: str = ""
    status: str = ""  # the confirming point's: finished, failed, stopped, skipped ("": none)
    reason: str = ""
    samples_per_s: float | None = None
    noise: float | None = None
    speedup: float | None = None
    speedup_noise: float | None = None
    marks: list = field(default_factory=list)  # why the measured figure is not clean
    flags: list = field(default_factory=list)  # compare's: why its speedup is not a result

    def to_dict(self) -> dict[str, Any]:
        return {**self.ranked.to_dict(), "rank": self.rank, "run_id": self.run_id,
                "status": self.status, "status_reason": self.reason,
                "samples_per_s": self.samples_per_s, "noise": self.noise,
                "speedup": self.speedup, "speedup_noise": self.speedup_noise,
                "marks": list(self.marks), "flags": list(self.flags)}


def figure_marks(row) -> list[str]:
    """Why a run's measured speed is not a clean figure ([] when it is)."""
    out = []
    if row.contended:
        out.append(f"contended ({machine.note(row.machine).removeprefix('contended: ')})")
    if not row.steady:
        out.append("no steady-state steps (warm-up included)")
    elif row.noise is None:
        out.append("noise unknown (too few steady windows)")
    elif row.noise > NOISY:
        out.append(f"noisy (±{row.noise:.0%}, above {NOISY:.0%})")
    return out


def results(ranked: list[Ranked], points: list, runs_dir) -> list[Result]:
    """Every ranked candidate with what its confirming point measured (points: the sweep's,
    in the same order as the top of ``ranked``)."""
    out = [Result(r, i + 1) for i, r in enumerate(ranked)]
    dirs = [runs_dir / p.run_id for p in points if p.run_id]
    items = {it.row.id: it for it in compare(dirs, runs_dir, only_compared=True)} if dirs else {}
    for res, p in zip(out, points, strict=False):  # the points: the top of ``ranked``
        res.run_id, res.status, res.reason = p.run_id, p.status, p.reason
        it = items.get(p.run_id)
        if it is None or p.status != "finished":
            continue
        res.samples_per_s, res.noise = it.row.samples_per_s, it.row.noise
        res.speedup, res.speedup_noise = it.speedup, (
            it.speedup * it.noise if it.speedup is not None and it.noise is not None else None)
        res.marks, res.flags = figure_marks(it.row), list(it.flags)
    return out


def choose(res: list[Result]) -> tuple[Result | None, list[str]]:
    """The chosen candidate (the fastest measured; else the predicted fastest) and the lines
    that say what the choice rests on."""
    measured = [r for r in res if r.samples_per_s]
    if not measured:
        best = next((r for r in res if r.ranked.samples_per_s and not r.ranked.reason), None)
        if best is None:
            return None, ["no candidate has a prediction or a measurement: nothing to choose"]
        return best, [f"chosen by the prediction alone: no confirming run finished "
                      f"({best.ranked.cand.label})"]
    measured.sort(key=lambda r: -(r.samples_per_s or 0.0))
    best = measured[0]
    notes = [f"chosen: {best.ranked.cand.label}, {best.samples_per_s:,.0f} samples/s measured "
             f"(predicted {best.ranked.samples_per_s or 0:,.0f})"]
    if best.rank != 1:
        notes.append(f"the measurements overturned the prediction: it was ranked {best.rank}")
    if best.marks:
        notes.append(f"the choice rests on a figure that is {'; '.join(best.marks)}: "
                     f"run `gputui tune` again on a quieter machine to be sure")
    if best.flags:  # compare's trust rules: its speedup over the baseline is not a result
        notes.append(f"its speedup is flagged: {best.flags[0]}")
    if len(measured) > 1:
        second = measured[1]
        noise = (best.noise or MIN_NOISE) + (second.noise or MIN_NOISE)
        if (second.samples_per_s or 0.0) >= (best.samples_per_s or 0.0) * (1 - noise):
            notes.append(f"{second.ranked.cand.label} is within the noise of it (±{noise:.0%}"
                         f"): either will do")
    return best, notes


def row_of(res: Result, chosen: Result | None) -> dict[str, Any]:
    """A table row (text cells)."""
    r = res.ranked
    measured = "-"
    if res.samples_per_s:
        measured = f"{res.samples_per_s:,.0f}" + (f" ±{res.noise:.0%}" if res.noise else "")
    ratio = (f"{res.samples_per_s / r.samples_per_s:.2f}" if res.samples_per_s and
             r.samples_per_s else "-")
    check = "; ".join(res.marks + (["FLAGGED: " + res.flags[0]] if res.flags else []))
    if not res.samples_per_s and res.status:
        check = res.reason or res.status
    elif not res.status and r.reason:
        check = r.reason
    speed = "-" if res.speedup is None else f"{res.speedup:.2f}x" + (
        f" ±{res.speedup_noise:.2f}" if res.speedup_noise else "")
    return {"chosen": "*" if res is chosen else "", "rank": str(res.rank),
            "candidate": r.cand.label,
            "pred_step_ms": f"{r.step_s * 1000:.1f} ms" if r.step_s else "-",
            "pred_samples_per_s": f"{r.samples_per_s:,.0f}" if r.samples_per_s else "-",
            "samples_per_s": measured, "measured_vs_pred": ratio, "speedup": speed,
            "check": check}


def preset_text(cfg, best: Result, source: str, command: str, preset_batch: int) -> str:
    """The chosen configuration as a preset: what chose it in its top comment, then the
    config (``RunConfig.to_toml``, which ``load_preset`` reads back unchanged)."""
    r = best.ranked
    how = (f"measured {best.samples_per_s:,.0f} samples/s in a short confirming run "
           f"(predicted {r.samples_per_s or 0:,.0f})" if best.samples_per_s else
           f"chosen by the prediction alone ({r.samples_per_s or 0:,.0f} samples/s)")
    lines = [f"Tuned by `{command}` on {time.strftime('%Y-%m-%d %H:%M')}, from {source}:",
             f"{r.cand.label}: {how}."]
    if best.marks:
        lines.append(f"That figure is {'; '.join(best.marks)}.")
    if r.cand.batch != preset_batch:
        lines.append(f"The batch is tune's ({r.cand.batch}, the preset's {preset_batch}); the "
                     f"learning rate is the preset's: scale it if the training needs it.")
    return "".join(f"# {t}\n" for t in lines) + cfg.to_toml()
