"""What ``gputui tune`` chooses among: the candidate configurations, and their predicted speed.

A candidate is a strategy on the devices (``single`` on one of them), its micro-batches,
precision, compile mode, channels_last and batch per device. Those that cannot run are left
out with the reason (:func:`gputui.plan.validate`, which holds ``plan.why_not``'s rules), and
those the memory prediction says do not fit.

The prediction of a candidate is factorised: its strategy's prediction at the preset's own
settings (:func:`gputui.runs.predict.scaling.predict`, from this machine's measured inputs), whose
compute part is scaled by what each of the candidate's settings did to the measured
one-device step (a ``single`` run with that setting alone, at the batch it implies, over the
same run at the preset's settings); the communication part is unchanged (autocast keeps the
gradients in fp32, and micro-batches sync once per step). The confirming runs measure what
this model leaves out. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gputui.runs.predict.scaling import Inputs, Prediction, memory

MEM_SHARE = 0.9  # of a device's memory a candidate may be predicted to use


@dataclass(frozen=True)
class Candidate:
    """One configuration ``tune`` may choose."""

    strategy: str
    spec: str  # devices.spec ("cpu*2", "2"; one device for single)
    n: int  # devices it uses
    batch: int  # global batch (optim.batch_size; scale_with_devices off)
    micro_batches: int = 1
    precision: str = "fp32"
    compile: str = "off"
    channels_last: bool = False

    def settings(self) -> dict[str, Any]:
        """The config keys a run of it sets (beside strategy.name and devices.spec)."""
        return {"optim.batch_size": self.batch, "optim.scale_with_devices": False,
                "optim.micro_batches": self.micro_batches, "run.precision": self.precision,
                "run.compile": self.compile, "run.channels_last": self.channels_last}

    @property
    def label(self) -> str:
        """"ddp cpu*2 b256 (128/dev) mb2 bf16 compile=default cl"."""
        per = f" ({self.batch // self.n}/dev)" if self.n > 1 else ""
        extra = [f"mb{self.micro_batches}", self.precision]
        if self.compile != "off":
            extra.append(f"compile={self.compile}")
        if self.channels_last:
            extra.append("cl")
        return f"{self.strategy} {self.spec} b{self.batch}{per} {' '.join(extra)}"


@dataclass
class Ranked:
    """A candidate and its prediction (``reason`` when it has none)."""

    cand: Candidate
    step_s: float | None = None
    samples_per_s: float | None = None
    mem_per_device: int | None = None
    reason: str = ""
    factors: dict = field(default_factory=dict)  # setting -> its measured factor

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.cand.label, "strategy": self.cand.strategy,
                "spec": self.cand.spec, **self.cand.settings(),
                "predicted_step_s": self.step_s, "predicted_samples_per_s": self.samples_per_s,
                "predicted_mem_per_device": self.mem_per_device, "reason": self.reason,
                "factors": dict(self.factors)}


def compute_part(p: Prediction, inp: Inputs) -> float:
    """The part of a predicted step that is computation (the rest is communication and the
    pipeline's idle time), by each strategy's formula (docs/prediction.md)."""
    n, t = inp.n, p.terms
    if n == 1:
        return inp.t_1
    if p.strategy in ("ddp", "fsdp"):
        return t.get("t_own", t.get("t_c", 0.0))
    if p.strategy == "scratch":
        return t.get("t_c", 0.0) if inp.on_gpu else n * t.get("t_seq", 0.0)
    if p.strategy == "dp":
        return t.get("t_c", 0.0) if inp.on_gpu else inp.t_1 * inp.batch / max(inp.batch_1, 1)
    if p.strategy == "pp":
        m = max(1, inp.chunks)
        return t.get("t_c", 0.0) * (m + n - 1) / m
    return t.get("t_c", 0.0)  # tp: the rest is its activations' all-reduces


def axis_changes(c: Candidate, base: Candidate) -> dict[str, Any]:
    """The settings in which ``c`` differs from the preset's (each measured as a factor)."""
    out: dict[str, Any] = {}
    if c.micro_batches != base.micro_batches:
        out["optim.micro_batches"] = c.micro_batches
    if c.precision != base.precision:
        out["run.precision"] = c.precision
    if c.compile != base.compile:
        out["run.compile"] = c.compile
    if c.channels_last != base.channels_last:
        out["run.channels_last"] = c.channels_last
    return out


def rank(c: Candidate, base: Candidate, pred: Prediction, inp: Inputs,
         factors: dict[tuple[str, Any], float | None], batch_factor: float | None,
         mem_limit: int | None) -> Ranked:
    """``c``'s predicted step from its strategy's prediction ``pred`` (at the preset's
    settings and batch) and the measured factors of its settings; ``batch_factor``: the
    one-device step at ``c``'s batch over the preset's (None: not measured)."""
    r = Ranked(c)
    if pred.step_time_s is None:
        r.reason = pred.reason or "no prediction"
        return r
    scale = 1.0
    missing = []
    wanted = [(k, v) for k, v in axis_changes(c, base).items()]
    for key in wanted:
        f = factors.get(key)
        if f is None:
            missing.append(f"{key[0]}={key[1]}")
        else:
            r.factors[f"{key[0]}={key[1]}"] = f
            scale *= f
    if c.batch != base.batch:
        if batch_factor is None:
            missing.append(f"optim.batch_size={c.batch}")
        else:
            r.factors[f"optim.batch_size={c.batch}"] = batch_factor
            scale *= batch_factor
    if missing:
        r.reason = f"not measured within the budget: the one-device step with {', '.join(missing)}"
        return r
    r.step_s = pred.step_time_s + compute_part(pred, inp) * (scale - 1.0)
    r.samples_per_s = c.batch / r.step_s if r.step_s > 0 else None
    # activations: those of one micro-batch of this batch (memory() scales them by the batch)
    r.mem_per_device = memory(c.strategy, replace(inp, batch=max(1, c.batch // c.micro_batches)))
    if mem_limit and r.mem_per_device and r.mem_per_device > mem_limit:
        r.reason = (f"predicted {r.mem_per_device / 2**30:.2f} GiB per device, more than "
                    f"{MEM_SHARE:.0%} of the {mem_limit / MEM_SHARE / 2**30:.1f} GiB a device has")
    return r


def order(ranked: list[Ranked]) -> list[Ranked]:
    """Predicted fastest first (most samples/s); those without a prediction last."""
    return sorted(ranked, key=lambda r: (r.reason != "", -(r.samples_per_s or 0.0)))
