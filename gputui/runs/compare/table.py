"""Comparison of recorded runs: speed, speedup, scaling efficiency, communication, accuracy.

Speedup is measured against the *matching one-device run*: a finished run on one device with
the same model, dataset, training-set size and precision, and

1. preferably the same batch per device (the material's weak scaling: 256 on one device
   against 512 on two, with ``--scale-with-devices``), else
2. the same global batch (strong scaling: 256 on one device against 256 split over two).

Among several matches: an eager run (no run.compile, no channels_last, so a compiled run's
speedup includes what compiling bought), then a run among the compared ones (e.g. the same
sweep) first, then a ``single`` run over other one-device strategies, then the newest. Speedup
is samples/s over the baseline's samples/s (an epoch is the same data for both, so it is also
the ratio of epoch times); scaling efficiency is speedup / devices. Every speed figure is the
steady state's (``gputui.core.steady``: warm-up excluded); a resumed baseline is refused and an
impossible speedup flagged with the reason (``gputui.core.trust``); the predicted speedup comes
from this machine's kept measurements (``gputui.runs.predict.scaling``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gputui.core import breakdown, machine, runstore, scores, straggler
from gputui.core.breakdown import Breakdown
from gputui.core.config import from_dict
from gputui.core.devices import backend_for
from gputui.core.mesh import mesh_of
from gputui.core.steady import RULE
from gputui.core.straggler import Straggler
from gputui.core.trust import (APART, SWEPT, flags, noise_of, noisy, on_cpu,
                               refuse_baseline)
from gputui.runs.compare import waterfall
from gputui.runs.compare.waterfall import Waterfall
from gputui.runs.energy import run_figures
from gputui.runs.history import RunRow, load_rows, read_config, row_for
from gputui.runs.predict import comm_peak
from gputui.runs.predict.measure import Measurer
from gputui.runs.predict.scaling import SHORT_MARGIN, STRATEGIES, impossible, predict, short_of

TABLE_COLUMNS = ("id", "strategy", "devices", "batch", "time_per_epoch_s", "samples_per_s",
                 "speedup", "predicted_speedup", "efficiency", "comm_share", "bubble_share",
                 *breakdown.SHARE_COLUMNS, "comm_gbps", "mfu", "train_mem", "init_s", "test_acc",
                 "status", "baseline", "check")
# a sweep's table also names each run's fast path (precision, compile, channels_last)
SWEEP_COLUMNS = TABLE_COLUMNS[:4] + ("fast", ) + TABLE_COLUMNS[4:]


@dataclass
class CompareRow:
    """One run in a comparison: its row, the derived figures and its curves."""

    row: RunRow
    speedup: float | None = None
    efficiency: float | None = None
    comm_share: float | None = None  # mean StepMetrics.comm_share (None: not measured)
    # where a step's time went: the mean breakdown of the run's metered steps (the first,
    # warm-up, left out when there are more), over its devices (None: not measured)
    breakdown: Breakdown | None = None
    baseline: str = ""  # id of the matching one-device run
    baseline_kind: str = ""  # "same batch per device" | "same global batch"
    mfu: float | None = None  # mean StepMetrics.mfu (achieved FLOP/s over the devices' peak)
    flops_per_s: float | None = None  # mean StepMetrics.flops_per_s
    # the gradient all-reduce bandwidth achieved (mean StepMetrics.comm_gbps, GB/s; the first
    # metered step, warm-up, left out when there are more), and bench-comm's kept peak
    comm_gbps: float | None = None
    comm_peak_gbps: float | None = None
    comm_what: str = ""  # the collectives comm_gbps timed, in words (measured_collective)
    train_mem: int | None = None  # the largest device's params+grads+optim+activations, bytes
    # pp: the share of the pipeline's span its stages sat idle waiting on each other (mean
    # over stages and metered steps, the first left out), and the theory's (p-1)/(m+p-1)
    bubble_share: float | None = None
    bubble_theory: float | None = None
    # each kind of collective's seconds a metered step ("tp all-reduce", "fsdp all-gather",
    # ...), the mean over the ranks and the metered steps
    collectives: dict | None = None
    memory: list = field(default_factory=list)  # the last MemoryReport's per-device rows
    loss_curve: list = field(default_factory=list)  # [(epoch progress, loss)]
    acc_curve: list = field(default_factory=list)  # [(epoch, test accuracy or val loss)]
    flags: list = field(default_factory=list)  # why the speedup is not a result (gputui.core.trust)
    noise: float | None = None  # the speedup's relative noise (both runs' noise added)
    noisy: list = field(default_factory=list)  # why the speedup supports no conclusion
    warnings: list = field(default_factory=list)  # e.g. well short of its prediction
    refused: list = field(default_factory=list)  # baselines refused, with why
    predicted_speedup: float | None = None  # from this machine's kept measurements
    predicted_reason: str = ""  # why there is no prediction
    # the GPUs' energy over the training epochs (gputui.runs.energy; None off GPUs), the
    # first epoch reaching the target with the seconds and joules until then, and the
    # allocator peak against the memory model per device (gputui.core.memcheck)
    energy_j: float | None = None
    j_per_sample: float | None = None
    j_per_step: float | None = None
    target: str = ""  # e.g. "test acc >= 95.0% (baseline X's final)"
    to_target: dict | None = None
    memory_check: list = field(default_factory=list)
    # the rank the others waited for, over the metered steps (gputui.core.straggler)
    straggler: Straggler | None = None
    waterfall: Waterfall | None = None  # ideal to measured speedup, cause by cause

    def flat(self) -> dict[str, Any]:
        """Row and figures as one flat JSON-ready dict (curves left out)."""
        out = self.row.to_dict()
        out.update(speedup=self.speedup, efficiency=self.efficiency, comm_share=self.comm_share,
                   baseline=self.baseline, baseline_kind=self.baseline_kind,
                   predicted_speedup=self.predicted_speedup, flags=list(self.flags),
                   warnings=list(self.warnings), refused=list(self.refused),
                   check=check_text(self), speedup_noise=_abs(self.speedup, self.noise),
                   efficiency_noise=_abs(self.efficiency, self.noise), noisy=list(self.noisy),
                   contended=self.row.contended,
                   machine_note=machine.note(self.row.machine), mfu=self.mfu,
                   flops_per_s=self.flops_per_s,
                   train_mem=self.train_mem, comm_gbps=self.comm_gbps,
                   comm_peak_gbps=self.comm_peak_gbps, bubble_share=self.bubble_share,
                   bubble_theory=self.bubble_theory, collectives=self.collectives,
                   energy_j=self.energy_j,
                   j_per_sample=self.j_per_sample, j_per_step=self.j_per_step,
                   target=self.target, to_target=self.to_target,
                   memory_check=[dict(r) for r in self.memory_check])
        out.update(breakdown.shares(self.breakdown))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything, curves included (the JSON export)."""
        return dict(self.flat(), loss_curve=[list(p) for p in self.loss_curve],
                    acc_curve=[list(p) for p in self.acc_curve],
                    breakdown=self.breakdown.to_dict() if self.breakdown else None,
                    memory=[dict(r) for r in self.memory],
                    straggler=self.straggler.to_dict() if self.straggler else None,
                    waterfall=self.waterfall.to_dict() if self.waterfall else None)


def _abs(value: float | None, noise: float | None) -> float | None:
    return None if value is None or noise is None else value * noise


def readable_events(run_dir: str | Path) -> list:
    """The record's events, or none when they cannot be read (the row says why: RunRow.problem)."""
    try:
        return runstore.read_events(run_dir)
    except OSError:
        return []


def read_record(run_dir: str | Path, events: list | None = None
                ) -> tuple[list, list, float | None, Breakdown | None]:
    """(loss curve, accuracy curve, mean comm share, mean step breakdown) from a record's
    readable events; the breakdown leaves the first metered step (warm-up) out when there
    are others."""
    loss, acc, shares, parts = [], [], [], []
    events = readable_events(run_dir) if events is None else events
    for ev in events:
        if ev.kind == "step":
            loss.append((ev.epoch - 1 + ev.step / max(ev.steps_per_epoch, 1), ev.loss))
            if ev.comm_share is not None:
                shares.append(ev.comm_share)
            if ev.breakdown:
                parts.append(ev.breakdown)
        elif ev.kind == "epoch_end":  # a language model's curve is its validation loss
            lm = getattr(ev, "task", "classify") == "lm"
            acc.append((ev.epoch, ev.val_loss if lm else ev.test_acc))
    share = sum(shares) / len(shares) if shares else None
    return loss, acc, share, breakdown.mean(parts[1:] if len(parts) > 1 else parts)


def read_hw_figures(run_dir: str | Path, events: list | None = None) -> dict[str, Any]:
    """{"mfu", "flops_per_s", "comm_gbps", "train_mem", "memory"} from a record's readable
    events: the means over its log windows (comm_gbps: its metered steps but the first, when
    there are more), and its last MemoryReport (None / [] where not recorded)."""
    mfus, rates, memory, gbps, bubbles, theory, slow = [], [], [], [], [], None, []
    named: dict[str, list[float]] = {}  # each kind of collective's seconds, per rank and step
    events = readable_events(run_dir) if events is None else events
    for ev in events:
        if ev.kind == "step":
            for r in ev.per_device:
                for kind, seconds in (getattr(r, "collectives", None) or {}).items():
                    named.setdefault(kind, []).append(float(seconds))
            if getattr(ev, "mfu", None) is not None:
                mfus.append(ev.mfu)
            if getattr(ev, "flops_per_s", None) is not None:
                rates.append(ev.flops_per_s)
            if getattr(ev, "comm_gbps", None) is not None:
                gbps.append(ev.comm_gbps)
            if (found := straggler.find(ev.per_device)) is not None:
                slow.append(found)
            share = breakdown.mean_value(r.bubble_share for r in ev.per_device)
            if share is not None:
                bubbles.append(share)
                theory = breakdown.mean_value(r.bubble_theory for r in ev.per_device)
        elif ev.kind == "memory":
            memory = [r.to_dict() for r in ev.per_device]
    totals = [sum(r.get(k) or 0 for k in ("params", "grads", "optim", "activations"))
              for r in memory]
    return {"mfu": sum(mfus) / len(mfus) if mfus else None,
            "flops_per_s": sum(rates) / len(rates) if rates else None,
            "comm_gbps": breakdown.mean_value(gbps[1:] or gbps),
            "train_mem": max(totals) if totals else None, "memory": memory,
            "bubble_share": breakdown.mean_value(bubbles[1:] or bubbles),
            "bubble_theory": theory, "straggler": straggler.over_steps(slow),
            "collectives": {k: sum(v) / len(v) for k, v in sorted(named.items())} or None}


def measured_collective(row: RunRow) -> str:
    """What a run's achieved bandwidth timed, by its mesh: the gradient all-reduce of a
    ddp group (ddp, a mesh of replicas), or the activation all-reduces of a tensor-parallel
    group with no data-parallel dimension beside it (tp: four a block, two in forward and
    two in backward)."""
    try:
        shape = mesh_of(from_dict(read_config(Path(row.run_dir))), row.devices or 1)
    except Exception:  # noqa: BLE001 - a damaged config names no collective
        return "its timed collectives"
    if shape.data_parallel == "ddp":
        return "its gradient all-reduce"
    if shape.tp > 1:
        return "its tensor-parallel activation all-reduces, 4 a block"
    return "its timed collectives"


def match_key(row: RunRow) -> tuple:
    """What must be equal for two runs to be compared for speed (a language model's context
    too: a sweep over it compares each length with single's at that length)."""
    return (row.model, row.dataset, row.train_size, row.precision, row.context)


def check_text(item: "CompareRow") -> str:
    """The table's check cell: FLAGGED, below prediction, or empty."""
    if item.flags:
        return "FLAGGED"
    if item.noisy:
        return "NOISY"
    if item.warnings:
        return "below prediction"
    return ""


def find_baseline(row: RunRow, candidates: list[RunRow],
                  compared: Collection[str] = frozenset(),
                  refused: list | None = None,
                  only_compared: bool = False) -> tuple[RunRow | None, str]:
    """The matching one-device run of ``row`` (see the module docstring) and the match kind;
    candidates not measured the way ``row`` was are refused (``gputui.core.trust``), and why is
    appended to ``refused``; ``only_compared``: a sweep's runs take their baselines from the
    same sweep only."""
    if not row.devices or not row.batch:
        return None, ""
    per_device = row.batch / row.devices
    ranked = []
    for c in candidates:
        if (c.devices != 1 or c.status != "finished" or not c.samples_per_s
                or match_key(c) != match_key(row)
                or (only_compared and c.id not in compared)):
            continue
        why = refuse_baseline(row, c) if c.batch in (row.batch, per_device) else None
        if why:
            if refused is not None:
                refused.append(why)
            continue
        if c.batch == per_device:
            kind = 0
        elif c.batch == row.batch:
            kind = 1
        else:
            continue
        plain = c.fast in ("", c.precision)  # eager, default memory format: preferred
        ranked.append(((kind, not plain, c.id not in compared,
                        c.strategy != "single",
                        -_id_order(c)), c, kind))
    if not ranked:
        return None, ""
    _, best, kind = min(ranked, key=lambda t: t[0])
    return best, ("same batch per device", "same global batch")[kind]


def _id_order(row: RunRow) -> float:
    digits = "".join(ch for ch in row.id[:15] if ch.isdigit())
    return float(digits or 0)


def compare(run_dirs: Sequence[str | Path], runs_dir: str | Path | None = None,
            only_compared: bool = False, target_acc: float | None = None,
            target_loss: float | None = None) -> list[CompareRow]:
    """Compare these runs; baselines are looked for among them and every run under runs_dir
    (``only_compared``: among them only, as a sweep's are). Time and energy to a target:
    ``target_acc`` (a fraction) or ``target_loss``, else the baseline's final figure."""
    rows = [row_for(p) for p in run_dirs]
    compared = {r.id for r in rows}
    try:
        others = [r for r in load_rows(runs_dir) if r.id not in compared]
    except OSError:  # a runs folder that cannot be listed holds no baseline we can use
        others = []
    pool = rows + others
    out = []
    for row in rows:
        events = readable_events(row.run_dir)  # read once, for the curves and the figures
        loss, acc, share, parts = read_record(row.run_dir, events)
        item = CompareRow(row=row, comm_share=share, breakdown=parts, loss_curve=loss,
                          acc_curve=acc, **read_hw_figures(row.run_dir, events))
        if item.comm_gbps is not None:
            item.comm_peak_gbps = kept_comm_peak(row)
            item.comm_what = measured_collective(row)
        base, kind = find_baseline(row, pool, compared, item.refused, only_compared)
        if base is not None and row.samples_per_s and base.samples_per_s and row.devices \
                and row.steady:
            item.speedup = row.samples_per_s / base.samples_per_s
            item.efficiency = item.speedup / row.devices
            item.baseline, item.baseline_kind = base.id, kind
            item.noise = noise_of(row, base)
            item.flags = flags(row, base, item.speedup,
                               remedy=SWEPT if only_compared and base.id in compared else APART)
            item.noisy = noisy(row, base, item.speedup)
            add_prediction(item, base)
            base_bd = (parts if base.id == row.id else
                       read_record(base.run_dir)[3])
            item.waterfall = waterfall.for_run(row, item.speedup, parts, item.straggler,
                                               base, base_bd,
                                               pipeline=item.bubble_share is not None)
            if item.waterfall is not None and item.collectives:
                item.waterfall = replace(item.waterfall, comm_kinds=item.collectives)
        add_energy(item, base, target_acc, target_loss)
        out.append(item)
    return out


def columns_for(items: list[CompareRow], columns=TABLE_COLUMNS) -> tuple[str, ...]:
    """The table's columns for these runs: a language model's bring val loss, val ppl and
    tokens/s (``gputui.core.scores.columns_for``)."""
    return scores.columns_for(columns, [it.row for it in items])


def table_rows(items: list[CompareRow], columns=TABLE_COLUMNS) -> list[dict[str, Any]]:
    """The comparison as plain dicts with the table's columns, in order (and the noise of
    speedup and efficiency); a flagged speedup and efficiency read "flagged", a noisy one
    "noisy" (the reasons are in ``summary_lines`` and the JSON)."""
    out = []
    for item in items:
        flat = item.flat()
        if item.flags:
            flat.update(speedup="flagged", efficiency="flagged")
        elif item.noisy:
            flat.update(speedup="noisy", efficiency="noisy")
        # the noise travels beside the figure (``cell`` prints it; csv keeps the number)
        out.append({**{k: flat.get(k) for k in columns},
                    **{k: flat.get(k) for k in ("speedup_noise", "efficiency_noise")}})
    return out


BREAKDOWN_LEGEND = ("step breakdown, as shares of a metered step (mean over its devices and "
                    "steps): compute forward+backward, exposed communication the step waits "
                    "for, hidden communication overlapped with compute (inside compute), "
                    "optim the update, data waiting for the batch, host the rest (with the wait "
                    "of devices one process drives in turn)")


def summary_lines(items: list[CompareRow]) -> list[str]:
    """Plain sentences under the table: what each baseline was, and what is missing."""
    lines = [BREAKDOWN_LEGEND] if any(it.breakdown for it in items) else []
    for it in items:
        r = it.row
        if r.problem:
            lines.append(f"{r.id}: {r.problem}")
        for why in it.flags:
            lines.append(f"{r.id}: FLAGGED, speedup {it.speedup:.2f}x is not a result: {why}")
        if it.noisy and not it.flags:
            pm = (it.speedup or 0) * (it.noise or 0)
            lines.append(f"{r.id}: NOISY, speedup {it.speedup:.2f}x ±{pm:.2f} supports no "
                         f"conclusion: {'; '.join(it.noisy)}")
        if r.contended and not any(r.id in n for n in it.noisy):
            lines.append(f"{r.id}: {machine.note(r.machine)}")
        for why in it.warnings:
            lines.append(f"{r.id}: {why}")
        if it.comm_gbps is not None:
            lines.append(f"{r.id}: {comm_peak.text(it.comm_gbps, it.comm_peak_gbps)} "
                         f"({it.comm_what or 'its timed collectives'}, mean of the metered "
                         f"steps)"
                         + ("" if it.comm_peak_gbps else "; no bench-comm peak kept for "
                            "these devices: `gputui bench-comm` measures one"))
        if it.collectives:
            lines.append(f"{r.id}: collectives a step (mean over ranks and metered steps): "
                         + " · ".join(f"{k} {1000 * v:.1f} ms"
                                      for k, v in it.collectives.items()))
        if it.bubble_share is not None and it.bubble_theory is not None:
            lines.append(f"{r.id}: pipeline bubble {it.bubble_share:.0%} of the pipeline's "
                         f"span measured (its stages idle, waiting on each other), "
                         f"{it.bubble_theory:.0%} in theory ((p-1)/(m+p-1): equal stages, "
                         f"free sends)")
        lines += gpu_truth_lines(it)
        if it.straggler is not None:
            lines.append(f"{r.id}: {straggler.line(it.straggler)}")
        if it.baseline:
            lines.append(f"{r.id}: baseline {it.baseline} ({it.baseline_kind}); both from "
                         f"steady-state steps ({RULE})")
        elif r.no_speed or not r.samples_per_s:
            lines.append(f"{r.id}: no speed figures ({r.no_speed or r.status})")
        elif not r.steady:
            lines.append(f"{r.id}: no speedup: the run has no steady-state steps, warm-up "
                         f"included (run it longer)")
        else:
            refused = f"; refused: {'; '.join(it.refused)}" if it.refused else ""
            lines.append(f"{r.id}: no matching finished one-device run measured the same way, "
                         f"so no speedup (run the same preset with {one_device_flags(r)})"
                         f"{refused}")
    return lines


def one_device_flags(row: RunRow) -> str:
    """The flags that give ``row``'s one-device baseline on the kind of device it ran on
    (``--devices 1`` is refused where there is no GPU)."""
    on_cpu = all(name.startswith("cpu") for name in row.device_names)
    return f"--devices {'cpu' if on_cpu else '1'} --strategy single"


def as_plain(items: list[CompareRow]) -> list[dict[str, Any]]:
    """Every figure of every compared run, curves included."""
    return [it.to_dict() for it in items]


# What a comparison takes from NVML's truth about a run (``gputui.runs.energy``, the record's
# memory check): energy per sample, time and energy to a target, the allocator peak against the
# memory model.

def add_energy(item: "CompareRow", base: RunRow | None, acc: float | None,
               loss: float | None) -> None:
    """The run's energy figures, its time and energy to the target and its memory check."""
    what = "given"
    if acc is None and loss is None and base is not None:
        what = f"baseline {base.id}'s final"
        if base.task == "lm":
            loss = base.val_loss
        else:
            acc = base.test_acc
    got = run_figures(item.row.run_dir, acc, loss)
    item.energy_j, item.j_per_sample = got["energy_j"], got["j_per_sample"]
    item.j_per_step, item.to_target = got["j_per_step"], got["to_target"]
    item.memory_check = got["memory_check"]
    if acc is not None:
        item.target = f"test acc >= {acc * 100:.1f}% ({what})"
    elif loss is not None:
        item.target = f"val loss <= {loss:.4g} ({what})"


def gpu_truth_lines(it: "CompareRow") -> list[str]:
    """Energy per sample, time and energy to the target (printed where the run has energy
    figures or the target was given), and the allocator peak against the memory model."""
    r, out = it.row, []
    if it.energy_j is not None:
        per = f", {it.j_per_sample:.3g} J/sample" if it.j_per_sample is not None else ""
        out.append(f"{r.id}: energy {it.energy_j / 1000:.2f} kJ over its epochs{per} (the "
                   f"GPUs' energy counter)")
    if it.target and (it.energy_j is not None or "(given)" in it.target):
        t = it.to_target
        if t is None:
            out.append(f"{r.id}: did not reach {it.target}")
        else:
            joules = f", {t['joules'] / 1000:.2f} kJ" if t.get("joules") is not None else ""
            out.append(f"{r.id}: reached {it.target} at epoch {t['epoch']}: "
                       f"{t['seconds']:.1f} s of training{joules}")
    for m in it.memory_check:
        sign = "+" if m["diff"] >= 0 else "-"
        out.append(f"{r.id}: {m['device']} allocator peak {_mib(m['peak'])} against "
                   f"{_mib(m['predicted'])} predicted (params, grads, optimizer state, "
                   f"activations): {sign}{_mib(abs(m['diff']))}")
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


# What a comparison adds from this machine's kept measurements, never measuring: the
# communication peak bench-comm kept for the run's devices, and the speedup the prediction
# model gives for a recorded run, with a warning where the measured one falls short of it.

def kept_comm_peak(row: RunRow) -> float | None:
    """bench-comm's kept peak for the run's device kind and count over the backend "auto"
    picks (gloo on CPUs, nccl on GPUs); None when none is kept (never measures)."""
    cpu = on_cpu(row)
    if not row.devices:
        return None
    try:
        kind = "cpu" if cpu else "cuda"
        return comm_peak.peak(kind, row.devices, backend_for("auto", kind))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def add_prediction(item: CompareRow, base: RunRow) -> None:
    """The predicted speedup of ``item`` from this machine's kept measurements (never
    measures), and a warning when the measured one falls well short of it."""
    row = item.row
    if row.strategy not in STRATEGIES or not row.devices or row.devices < 2:
        return
    try:
        item.predicted_speedup, item.predicted_reason = predicted_speedup(row)
    except Exception as exc:  # noqa: BLE001 - a prediction never breaks a comparison
        item.predicted_reason = f"{type(exc).__name__}: {exc}"
    if short_of(item.speedup, item.predicted_speedup, noise_of(row, base)):
        item.warnings.append(
            f"speedup {item.speedup:.2f}x is well short of its prediction "
            f"{item.predicted_speedup:.2f}x (more than {SHORT_MARGIN:.0%} plus the noise "
            f"below): a straggler, the data path or contention the model does not see")


def predicted_speedup(row: RunRow) -> tuple[float | None, str]:
    """(predicted speedup, why none) for a recorded run, from kept measurements only."""
    if not row.devices:
        return None, "the record names no devices"
    cfg = from_dict(read_config(Path(row.run_dir)), source="record")
    kind = "cpu" if on_cpu(row) else "gpu"
    m = Measurer(cfg, kind, Path(row.run_dir).parent, line=lambda s: None, measure=False)
    inp = m.inputs(row.devices, [row.strategy])
    p = predict(row.strategy, inp)
    if p.speedup is None:
        return None, (p.reason or "no prediction") + (
            "; `gputui predict PRESET` measures it on this machine")
    why = impossible(p, inp, m.cores, (m.baseline or {}).get("noise"))
    if why:  # predict's own rule: an impossible prediction is no figure to fall short of
        return None, f"the prediction {p.speedup:.2f}x is no result: {why[0]}"
    return p.speedup, ""
