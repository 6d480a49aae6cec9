"""What a comparison takes from NVML's truth about a run (``gputui.runs.energy``, the record's
memory check): energy per sample, time and energy to a target, and the allocator peak against
the memory model. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputui.runs.history import RunRow

if TYPE_CHECKING:
    from gputui.runs.compare.table import CompareRow


def add_energy(item: "CompareRow", base: RunRow | None, acc: float | None,
               loss: float | None) -> None:
    """The run's energy figures, its time and energy to the target and its memory check."""
    from gputui.runs.energy import run_figures

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
