"""Numbers you can trust: which baselines a speedup may use, and which speedups are flagged.

A baseline is refused when it was not measured the way the run was: a resumed run (a
continuation, not a whole run), one without steady-state steps, or one measured in another
machine state (contended while the run was not, or the other way round). A speedup is
*noisy* (shown as such, never compared with a threshold) when its noise is above ``NOISY``,
when either run was contended, or when either has too few steady windows to know its noise.
A speedup or efficiency is flagged, with the reason, instead of shown as a result when it is
physically impossible:

- efficiency above 100 %, whatever the noise: N devices cannot do more than N times the
  work of one, so the figure says the baseline was slow, not the run fast;
- a speedup (above 1 beyond the noise) on devices that share one process: scratch, dp and
  model_parallel drive CPU virtual devices one after another from one process;
- a speedup on CPU ranks that share one set of cores: more ranks x threads than cores;
- a speedup from a run without steady-state steps (warm-up included).
Torch-free.
"""

from __future__ import annotations

from typing import Any

from gputui.core.mesh import MESH_STRATEGIES
from gputui.core.machine import CONTENDED
from gputui.core.ompwait import spins
from gputui.core.machine import note

SHARED_PROCESS = ("scratch", "dp", "model_parallel")  # one process drives every device
RANKS = MESH_STRATEGIES  # one process per device
MIN_NOISE = 0.02  # the least relative noise assumed for one measurement
NOISY = 0.20  # a speedup whose relative noise is above this supports no conclusion
# What an efficiency above 100 % asks for, by how the baseline was measured (``flags``'s
# ``remedy``): apart from the run, or in one sweep with it (back to back already, so the
# baseline was slowed as it ran)
APART = ("now (warm-up, other load, another session): measure both in one sweep")
SWEPT = ("(both ran in one sweep, so other load, or threads spinning on shared cores, slowed "
         "the baseline as it ran): rerun the sweep on a quiet machine, with --repeat 3 so each "
         "pass pairs its own baseline")


def on_cpu(row: Any) -> bool:
    """True when every device of the run is a CPU virtual device."""
    names = getattr(row, "device_names", None) or []
    return bool(names) and all(str(n).startswith("cpu") for n in names)


def refuse_baseline(row: Any, base: Any) -> str | None:
    """Why ``base`` cannot be ``row``'s baseline (one clause), or None. (A baseline without
    steady-state steps is not refused but ranked last and flagged, see :func:`flags`.)"""
    if base.resumed:
        return f"{base.id} is a resumed run (a continuation, measured apart)"
    if not base.steady:
        return f"{base.id} has no steady-state steps (warm-up included)"
    if bool(getattr(base, "contended", False)) != bool(getattr(row, "contended", False)):
        which = base.id if getattr(base, "contended", False) else row.id
        return (f"{base.id} ran in another machine state ({which} ran while other processes "
                f"used the hardware)")
    return None


def noisy(row: Any, base: Any, speedup: float) -> list[str]:
    """Why ``speedup`` supports no conclusion ([] when its noise is small enough)."""
    out = []
    for r in (row, base) if base.id != row.id else (row,):
        if getattr(r, "contended", False):
            out.append(f"{r.id} was {note(r.machine) or 'contended'}")
        elif r.steady and r.noise is None:
            out.append(f"{r.id} has too few steady windows to know its noise (run it longer)")
    noise = noise_of(row, base)
    if noise > NOISY:
        out.append(f"its noise ±{noise:.0%} is above {NOISY:.0%}")
    return out


def noise_of(row: Any, base: Any) -> float:
    """The relative noise of a speedup from one measurement of each run."""
    return max(MIN_NOISE, (row.noise or MIN_NOISE) + (base.noise or MIN_NOISE))


def flags(row: Any, base: Any, speedup: float, low: float | None = None,
          remedy: str = APART) -> list[str]:
    """The reasons ``speedup`` of ``row`` over ``base`` is not a result ([] when it is).
    ``low``: the lowest of repeated measurements (default: ``speedup``); less the runs' own
    noise, it is the bound the measurements allow. ``remedy`` ends an efficiency above
    100 %: what slowed the baseline and what to do (``APART``, ``SWEPT``, or predict's)."""
    n = row.devices or 1
    noise = noise_of(row, base)
    low = (speedup if low is None else low) * (1 - noise)
    out = []
    if not row.steady:
        out.append("warm-up included: the run has no steady-state steps (run it longer)")
    elif not base.steady:
        out.append(f"warm-up included: the baseline {base.id} has no steady-state steps")
    if speedup / n > 1:
        out.append(f"efficiency {speedup / n:.0%} exceeds 100 % (noise ±{noise:.0%}"
                   f"): impossible on {n} device{'s' if n != 1 else ''}; the baseline "
                   f"{base.id} ran slower than this machine runs it {remedy}")
    if n > 1 and on_cpu(row) and low > 1:
        if row.strategy in SHARED_PROCESS:
            out.append(f"{row.strategy} drives its {n} CPU virtual devices one after another "
                       f"from one process: no speedup is possible, the baseline was slower")
        elif row.strategy in RANKS and row.threads and row.cores and \
                n * row.threads > row.cores:
            out.append(f"{n} ranks x {row.threads} thread(s) share {row.cores} cores: no "
                       f"speedup over one process using those cores is possible")
    return out


def poisoned(state: dict | None, noise: float | None = None, threads: int = 0,
             omp_wait: str = "") -> str:
    """Why a run's speed cannot serve as a baseline, in plain words with the remedy ("" when
    it can): other processes held the cores while it ran (``state``: its machine.json), or
    its steady steps varied (``noise``, from its steady figures) by more than ``NOISY``.
    Spinning threads (``threads``, ``omp_wait``: see gputui.core.ompwait) are named: under
    contention they make every step wait for the time slice a spinning partner burns."""
    share = (state or {}).get("others_share") or 0.0
    why = []
    if share >= CONTENDED:
        cores = (state or {}).get("cores")
        load = (state or {}).get("load_end")
        why.append(f"other processes used {share:.0%} of the {cores} cores while it ran"
                   + (f" (load {load})" if load is not None else ""))
    if noise is not None and noise > NOISY:
        why.append(f"its steady steps varied ±{noise:.0%} (above {NOISY:.0%})")
    if not why:
        return ""
    text = "its speed is not a baseline: " + " and ".join(why)
    if threads > 1 and spins(omp_wait) and share >= CONTENDED:
        text += (f"; its {threads} threads spin while they wait ({omp_wait}), so each step also "
                 f"waits for the time the others take: unset OMP_WAIT_POLICY or set it to "
                 f"PASSIVE")
    return (text + "; rerun it on a quiet machine (load below its cores), and measure the runs "
            "you compare back to back in one sweep (`gputui sweep PRESET --repeat 3`)")
