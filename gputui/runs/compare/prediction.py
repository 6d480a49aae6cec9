"""What a comparison adds from this machine's kept measurements, never measuring: the
communication peak bench-comm kept for the run's devices, and the speedup the prediction model
gives for a recorded run, with a warning where the measured one falls well short of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gputui.runs.history import RunRow

if TYPE_CHECKING:
    from gputui.runs.compare.table import CompareRow


def kept_comm_peak(row: RunRow) -> float | None:
    """bench-comm's kept peak for the run's device kind and count over the backend "auto"
    picks (gloo on CPUs, nccl on GPUs); None when none is kept (never measures)."""
    from gputui.core.devices import backend_for
    from gputui.core.trust import on_cpu
    from gputui.runs.predict.comm_peak import peak

    cpu = on_cpu(row)
    if not row.devices:
        return None
    try:
        kind = "cpu" if cpu else "cuda"
        return peak(kind, row.devices, backend_for("auto", kind))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def add_prediction(item: CompareRow, base: RunRow) -> None:
    """The predicted speedup of ``item`` from this machine's kept measurements (never
    measures), and a warning when the measured one falls well short of it."""
    from gputui.core.trust import noise_of
    from gputui.runs.predict.scaling import STRATEGIES, SHORT_MARGIN, short_of

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
    from gputui.core.config import from_dict
    from gputui.core.trust import on_cpu
    from gputui.runs.history import read_config
    from gputui.runs.predict.scaling import impossible, predict
    from gputui.runs.predict.measure import Measurer

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
