"""Reading two parameter traces and saying where they part (``gputui verify``'s comparison).

A trace (written by the run, :mod:`gputui.train.paramtrace`) holds the loss of each step and
the parameters before the first step (index 0) and after each one (index k): whole for a
small model, as a checksum per parameter (sum, sum of squares) for a large one, whose last
step is still whole. Torch-free: numpy reads the ``.npz`` without pickles.

Two traces agree where every parameter agrees elementwise within ``atol + rtol * |single's|``
(``torch.testing.assert_close``'s rule, float32's tolerance or the precision's) and every
loss within the same rule. The first step that breaks it is named with the parameter that
broke it most (its largest difference over its tolerance); a loss that differs at step k
while the parameters of step k-1 agree is named as the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_NAME = "param_trace.npz"  # as gputui.train.paramtrace writes it
# (rtol, atol) per run.precision: float32's as the equivalence tests, and the looser ones of
# the reduced-precision tests (tests/unit/test_equivalence_dp_mp.py)
TOLERANCES = {"fp32": (1e-5, 1e-6), "bf16": (2e-2, 2e-3), "fp16": (2e-2, 2e-3)}


@dataclass
class Trace:
    """One run's trace: the names, the losses, and per step either the whole parameters
    (``params``) or the checksums (``sums``, one (sum, sum of squares) per parameter)."""

    names: list[str]
    losses: list[float]
    params: list[list[Any]] | None
    sums: Any | None
    last: list[Any]


def read_trace(run_dir: str | Path) -> Trace:
    """The trace a run left; raises ValueError (one line) when it is missing or unreadable."""
    import numpy as np

    path = Path(run_dir) / TRACE_NAME
    try:
        with np.load(path, allow_pickle=False) as z:
            names = [str(n) for n in z["names"]]
            losses = [float(v) for v in z["losses"]]
            if "sums" in z.files:
                last = [z[f"last_p{j}"] for j in range(len(names))]
                return Trace(names, losses, None, z["sums"], last)
            steps = len(losses) + 1
            params = [[z[f"s{i}_p{j}"] for j in range(len(names))] for i in range(steps)]
            return Trace(names, losses, params, None, params[-1])
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: no readable parameter trace ({type(exc).__name__})") from None


@dataclass(frozen=True)
class Difference:
    """How one run's trace differs from single's."""

    max_param_diff: float  # the largest |a - b| of any parameter after the last step
    max_param_name: str
    max_loss_diff: float  # the largest |loss - single's loss| of any step
    first_step: int | None  # the first step whose parameters or loss broke the tolerance
    first_what: str  # the parameter that broke it most, or "loss"
    steps: int

    @property
    def passed(self) -> bool:
        return self.first_step is None


def _worst(a: list[Any], b: list[Any], names: list[str], rtol: float,
           atol: float) -> tuple[float, str, float, str]:
    """(largest |a-b|, its parameter, largest |a-b| / tolerance, its parameter)."""
    import numpy as np

    big, big_name, ratio, ratio_name = 0.0, "", 0.0, ""
    for name, x, y in zip(names, a, b, strict=True):
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        if d.size == 0:
            continue
        m = float(d.max())
        r = float((d / (atol + rtol * np.abs(y.astype(np.float64)))).max())
        if not np.isfinite(m):
            m = r = float("inf")
        if m > big or not big_name:
            big, big_name = m, name
        if r > ratio or not ratio_name:
            ratio, ratio_name = r, name
    return big, big_name, ratio, ratio_name


def _sums_off(a: Any, b: Any, n: list[int], rtol: float, atol: float) -> tuple[float, int]:
    """The checksums' largest difference over its tolerance, and the parameter's index."""
    ratio = _sums_ratios(a, b, n, rtol, atol)
    j = int(ratio.argmax())
    return float(ratio[j]), j


def _sums_ratios(a: Any, b: Any, n: list[int], rtol: float, atol: float) -> Any:
    """Each parameter's checksum difference over its tolerance (inf where not finite)."""
    import numpy as np

    n_ = np.array(n, dtype=np.float64)
    norm = np.sqrt(np.maximum(b[:, 1], 0.0))
    tol_sum = n_ * atol + rtol * np.sqrt(n_) * norm
    tol_sq = 2 * norm * (np.sqrt(n_) * atol + rtol * norm) + 1e-30
    ratio = np.maximum(np.abs(a[:, 0] - b[:, 0]) / (tol_sum + 1e-30),
                       np.abs(a[:, 1] - b[:, 1]) / tol_sq)
    return np.where(np.isfinite(ratio), ratio, np.inf)


def compare(ref: Trace, got: Trace, rtol: float, atol: float) -> Difference:
    """How ``got`` differs from ``ref`` (single's); ValueError when they do not describe the
    same model (names or shapes)."""
    if ref.names != got.names:
        only = sorted(set(ref.names) ^ set(got.names))
        raise ValueError("the parameters are not the same model's: "
                         + (", ".join(only[:3]) or "in another order"))
    shapes = [(x.shape, y.shape) for x, y in zip(ref.last, got.last, strict=True)]
    bad = next((n for n, (x, y) in zip(ref.names, shapes, strict=True) if x != y), None)
    if bad is not None:
        raise ValueError(f"parameter {bad} has another shape than single's")
    steps = min(len(ref.losses), len(got.losses))
    big, big_name, _, _ = _worst(got.last, ref.last, ref.names, rtol, atol)
    loss_diffs = [abs(a - b) for a, b in zip(got.losses, ref.losses, strict=False)]
    first, what = None, ""
    for k in range(steps + 1):  # k = 0: the parameters both started from
        if k and not loss_diffs[k - 1] <= atol + rtol * abs(ref.losses[k - 1]):
            first, what = k, "loss"
            break
        if ref.params is not None and got.params is not None:
            _, _, ratio, name = _worst(got.params[k], ref.params[k], ref.names, rtol, atol)
        elif ref.sums is not None and got.sums is not None:
            n = [x.size for x in ref.last]
            ratio, j = _sums_off(got.sums[k], ref.sums[k], n, rtol, atol)
            name = ref.names[j]
        else:
            raise ValueError("one trace holds whole parameters, the other checksums")
        if not ratio <= 1.0:
            first, what = k, name
            break
    if first is None and len(got.losses) != len(ref.losses):
        first, what = steps + 1, "loss"  # one run trained fewer steps than the other
    return Difference(big, big_name, max(loss_diffs, default=0.0), first, what, steps)


def broken(ref: Trace, got: Trace, rtol: float, atol: float) -> set[str]:
    """The parameters that break the tolerance at any step (``compare``'s rule)."""
    import numpy as np

    out: set[str] = set()
    steps = min(len(ref.losses), len(got.losses)) + 1
    for k in range(steps):
        if ref.params is not None and got.params is not None:
            for name, x, y in zip(ref.names, got.params[k], ref.params[k], strict=True):
                d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                tol = atol + rtol * np.abs(y.astype(np.float64))
                if d.size and not bool((d <= tol).all()):
                    out.add(name)
        elif ref.sums is not None and got.sums is not None:
            ratios = _sums_ratios(got.sums[k], ref.sums[k], [x.size for x in ref.last], rtol,
                                  atol)
            out.update(n for n, r in zip(ref.names, ratios, strict=True) if not r <= 1.0)
    return out


def largest(ref: Trace, got: Trace) -> float:
    """The largest |difference| of any parameter element at any step kept whole."""
    import numpy as np

    whole = ref.params is not None and got.params is not None
    pairs = zip(got.params or [], ref.params or [], strict=False) if whole \
        else [(got.last, ref.last)]
    big = 0.0
    for a, b in pairs:
        for x, y in zip(a, b, strict=True):
            if x.size:
                d = float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max())
                big = max(big, d if np.isfinite(d) else float("inf"))
    return big


def explain(ref: Trace, got: Trace, control: Trace, rtol: float, atol: float,
            bound: float) -> str | None:
    """Why a difference beyond the tolerance is the arithmetic's alone, or None when it is
    not. ``control`` is single again, summing each batch in another order (micro-batches):
    a change of the arithmetic and nothing else. The difference is explained when every loss
    agrees within the tolerance (or within the control's own loss difference), every element
    stays within ``bound`` (what the optimizer's update can move an element by when rounding
    changes its gradient: see ``gputui.runs.verify.rounding_bound``), and every parameter
    that broke the tolerance broke it in the control too."""
    off = broken(ref, got, rtol, atol)
    if not off:
        return None
    control_off = broken(ref, control, rtol, atol)
    control_loss = max((abs(a - b) for a, b in zip(control.losses, ref.losses, strict=False)),
                       default=0.0)
    steps = min(len(ref.losses), len(got.losses))
    if len(got.losses) != len(ref.losses) or any(
            not abs(a - b) <= max(atol + rtol * abs(b), control_loss)
            for a, b in zip(got.losses[:steps], ref.losses[:steps], strict=True)):
        return None
    big = largest(ref, got)
    if not big <= bound or not off <= control_off:
        return None
    names = sorted(off)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{shown} moved apart by up to {big:.2g}, within the {bound:.2g} the optimizer's "
            f"update allows, and moved apart in single too when it only summed its batches "
            f"in another order (largest there {largest(ref, control):.2g}); the losses agree")
