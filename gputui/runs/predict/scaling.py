"""Predicted scaling: step time, speedup, efficiency and memory per device before a run.

The model (docs/prediction.md) takes measured inputs only:

- ``t_c``: the steady step time of one process training its share of the batch (B/N per
  device) with the threads it would get (on the CPU N ranks on C cores get C/N threads each,
  and N such processes run at once while it is measured, so contention for the cores and
  memory is in the figure); on GPUs one process on one GPU. ``t_seq``: the same share trained
  by one process with every core (scratch's CPU replicas run one after another).
- ``t_own``: like ``t_c``, but trained by the strategy itself on a world of one rank (N such
  one-rank jobs at once on the CPU), less the communication that run measured (its step
  breakdown's exposed comm): ``t_c`` plus the strategy's own per-step work (DDP's reducer:
  autograd hooks, copies into its buckets, the optimizer over bucket views; the loop's
  per-rank collectives). ddp and fsdp use it in place of ``t_c`` where it was measured.
- ``t_ar``: the measured time of one allreduce of the gradient bytes G (= parameter bytes)
  over N ranks, issued as DDP issues it: once between two steps' compute, and for gradients
  above DDP's first bucket with every CPU core kept busy, as backward keeps them
  (:func:`gputui.runs.predict.measure.allreduce_in_step`); ``t_copy``: the scratch allreduce
  (copies inside one process, ``gputui bench-comm``).
- ``t_fsdp``: what one step's fsdp collectives add to it, timed between ranks
  (:func:`gputui.runs.predict.measure.fsdp_in_step`): the model's fully_shard units counted,
  each all-gathered before its forward and again before its backward (the root only once) and
  its gradients reduce-scattered, each call at its unit's flat bytes, with the step's compute
  (t_own) cut into slices between the calls.

Per step, N devices:

    ddp:     t_N = t_own + max(0, t_ar - overlap) + t_sync / log_every
    fsdp:    t_N = t_own + max(0, t_fsdp - overlap) + t_sync / log_every
             (t_sync: the loop's one small all-reduce of the window's losses per log
             window, measured like t_ar; where t_fsdp was not measured, figures kept before
             it was: 1.5 t_ar, two all-gathers and a reduce-scatter of G)
    tp:      t_N = t_c + 4 L t_act + t_sync / log_every
             (the GPT's L blocks each all-reduce the B x T x E activation twice in forward
             and twice in backward; t_act: one such all-reduce over N ranks, measured like
             t_ar between slices of compute; t_c, the step of B/N examples on the whole
             model, stands in for the whole batch on 1/N of each block: the same block FLOPs,
             but the embeddings, norms and head are not split, so it is a lower bound)
    scratch: t_N = N t_seq + t_copy   on CPU (one process)   t_c + t_copy on GPUs
    dp:      t_N = t_1                on CPU (no replication) t_c + 2 t_copy on GPUs
    pp:      t_N = t_c (m + N - 1) / m + t_sync / log_every
             (N balanced stages, m = strategy.pipeline_chunks micro-batches: a stage's compute
             of the whole batch is about t_c, and the pipeline's fill and drain idle each stage
             (N - 1) / (m + N - 1) of the step, the bubble; the activations' sends are not
             modelled, the run's step breakdown measures them)
    overlap = 0 on the CPU (the ranks' cores do the reduction); on GPUs the buckets after
              DDP's last one overlap backward: min(t_comm * (1 - 25 MiB / G)+, 2/3 t_c)

speedup = (B_N / t_N) / (B_1 / t_1), efficiency = speedup / N. Memory per device (training
bytes): parameters + gradients + optimizer state (P x 4 bytes each; momentum adds one, Adam
two) plus the activations measured on one device (its peak allocation minus those, GPUs only),
split N ways by the batch; fsdp and tp (a lower bound there: the embeddings, norms and head
are replicated) divide the first part by N; pp divides both by N (a stage holds 1/N of the
layers), its activations those of the micro-batches in flight: all m under GPipe, at most N
under 1F1B. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from gputui.core.trust import flags

STRATEGIES = ("ddp", "fsdp", "tp", "scratch", "dp", "pp")
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket cap: the last bucket cannot overlap backward
FORMULAS = {
    "ddp": "t_own + max(0, t_ar - overlap) + t_sync / log_every",
    "fsdp": "t_own + max(0, t_fsdp - overlap) + t_sync / log_every",
    "tp": "t_c + 4 L t_act + t_sync / log_every",
    "scratch": "N t_seq + t_copy (cpu) | t_c + t_copy (gpu)",
    "dp": "t_1 (cpu, no replication) | t_c + 2 t_copy (gpu)",
    "pp": "t_c (m + N - 1) / m + t_sync / log_every",
}
SHORT_MARGIN = 0.15  # a measured point this far (plus its noise) below its prediction is flagged


@dataclass
class Inputs:
    """The measured inputs of one prediction (seconds; bytes)."""

    n: int
    on_gpu: bool
    batch: int  # global batch on N devices
    batch_1: int  # global batch of the one-device run
    t_1: float  # steady step time on one device, the whole batch_1
    t_c: float | None = None  # one process, its share B/N, its threads, N running at once
    t_seq: float | None = None  # one process with every core, the share B/N (CPU scratch)
    # strategy -> its own step on one rank (B/N, a rank's threads, N at once), comm excluded
    t_own: dict[str, float] = field(default_factory=dict)
    t_ar: float | None = None  # torch.distributed allreduce of grad_bytes over N ranks
    t_copy: float | None = None  # scratch allreduce of grad_bytes over N devices
    t_fsdp: float | None = None  # one step's fsdp all-gathers and reduce-scatters, N ranks
    t_sync: float | None = None  # allreduce of the window's losses (log_every floats), N ranks
    t_act: float | None = None  # tp: one allreduce of a B x T x E activation over N ranks
    tp_blocks: int = 0  # tp: the GPT's blocks (L); 0 when the model is not the GPT
    log_every: int = 20
    grad_bytes: int = 0
    params: int = 0
    momentum: bool = True
    optim_states: int | None = None  # state tensors per parameter (adam: 2); None: momentum's
    activations_1: int | None = None  # activation bytes of the one-device run (GPU)
    chunks: int = 1  # pp: micro-batches per step (strategy.pipeline_chunks)
    schedule: str = "1f1b"  # pp: gpipe or 1f1b (activation memory)


@dataclass
class Prediction:
    """One predicted point."""

    strategy: str
    n: int
    batch: int
    step_time_s: float | None = None
    samples_per_s: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    mem_per_device: int | None = None  # training bytes per device
    formula: str = ""
    terms: dict = field(default_factory=dict)
    reason: str = ""  # why no prediction (an input that was not measured)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def overlap(t_comm: float, inp: Inputs, compute: float | None = None) -> float:
    """The part of a gradient collective hidden behind backward (0 on the CPU); ``compute``:
    the step's compute time (``inp.t_c`` when not given)."""
    compute = inp.t_c if compute is None else compute
    if not inp.on_gpu or not compute or inp.grad_bytes <= BUCKET_BYTES:
        return 0.0
    return min(t_comm * (1 - BUCKET_BYTES / inp.grad_bytes), 2 / 3 * compute)


def static_bytes(inp: Inputs) -> int:
    """Parameters, gradients and optimizer state of one full replica."""
    states = inp.optim_states if inp.optim_states is not None else int(inp.momentum)
    return inp.params * 4 * (2 + states)


def unmodelled(cfg) -> str | None:
    """Why predict (and tune, which ranks by it) cannot answer for ``cfg``'s mesh levers, or
    None: its models are ddp's, ZeRO-3 fsdp's, tp's, pp's on GPipe/1F1B, scratch's and dp's,
    without activation checkpointing."""
    par = cfg.parallel
    levers = [f"parallel.{k} = {getattr(par, k)!r}" for k, default in
              (("zero", 3), ("ac", "none")) if getattr(par, k) != default]
    if cfg.strategy.schedule not in ("gpipe", "1f1b"):
        levers.append(f"strategy.schedule = {cfg.strategy.schedule!r}")
    if cfg.model.moe_experts:  # a mixture of experts, and ep's all-to-alls: not modelled
        levers.append(f"model.moe_experts = {cfg.model.moe_experts}")
    if not levers:
        return None
    return (f"{', '.join(levers)}: predict's models do not cover this yet (they are ddp, fsdp "
            f"at ZeRO-3, tp, pp on gpipe or 1f1b, scratch and dp, without activation "
            f"checkpointing); remove it with --set, or measure it with `gputui sweep`")


def predict(strategy: str, inp: Inputs) -> Prediction:
    """The prediction of ``strategy`` on ``inp.n`` devices from measured inputs."""
    p = Prediction(strategy, inp.n, inp.batch, formula=FORMULAS.get(strategy, ""))
    n = inp.n
    need: dict[str, float | None]
    if n == 1:
        t, p.formula = inp.t_1, "t_1 (measured)"
        need = {"t_1": inp.t_1}
    elif strategy in ("ddp", "fsdp"):
        own = inp.t_own.get(strategy)
        if own is None:  # not measured with the strategy itself: single's compute
            p.formula = p.formula.replace("t_own", "t_c")
            need = {"t_c": inp.t_c}
        else:
            need = {"t_own": own}
        compute = own if own is not None else inp.t_c
        if strategy == "fsdp" and inp.t_fsdp is not None:
            need.update(t_fsdp=inp.t_fsdp, t_sync=inp.t_sync)
            comm = inp.t_fsdp
        else:
            if strategy == "fsdp":  # kept figures without t_fsdp: the older estimate
                p.formula = p.formula.replace("t_fsdp", "1.5 t_ar")
            need.update(t_ar=inp.t_ar, t_sync=inp.t_sync)
            comm = (inp.t_ar or 0.0) * (1.5 if strategy == "fsdp" else 1.0)
        hidden = overlap(comm, inp, compute) if compute else 0.0
        need["overlap"] = hidden
        t = (compute or 0.0) + max(0.0, comm - hidden) + (inp.t_sync or 0.0) / max(
            1, inp.log_every)
    elif strategy == "tp":
        if not inp.tp_blocks:
            p.reason = "tp predicts the built-in GPT only (model.name = 'gpt')"
            return p
        need = {"t_c": inp.t_c, "t_act": inp.t_act, "t_sync": inp.t_sync,
                "L": float(inp.tp_blocks)}
        t = (inp.t_c or 0.0) + 4 * inp.tp_blocks * (inp.t_act or 0.0) + (
            inp.t_sync or 0.0) / max(1, inp.log_every)
    elif strategy == "scratch":
        p.formula = FORMULAS[strategy].split(" | ")[1 if inp.on_gpu else 0]
        if inp.on_gpu:
            need = {"t_c": inp.t_c, "t_copy": inp.t_copy}
            t = (inp.t_c or 0.0) + (inp.t_copy or 0.0)
        else:
            need = {"t_seq": inp.t_seq, "t_copy": inp.t_copy}
            t = n * (inp.t_seq or 0.0) + (inp.t_copy or 0.0)
    elif strategy == "dp":
        p.formula = FORMULAS[strategy].split(" | ")[1 if inp.on_gpu else 0]
        if inp.on_gpu:
            need = {"t_c": inp.t_c, "t_copy": inp.t_copy}
            t = (inp.t_c or 0.0) + 2 * (inp.t_copy or 0.0)
        else:
            need = {"t_1": inp.t_1}
            t = inp.t_1 * inp.batch / max(inp.batch_1, 1)
    elif strategy == "pp":
        need = {"t_c": inp.t_c, "t_sync": inp.t_sync}
        m = max(1, inp.chunks)
        t = (inp.t_c or 0.0) * (m + n - 1) / m + (inp.t_sync or 0.0) / max(1, inp.log_every)
    else:
        p.reason = f"no model for strategy '{strategy}' (predicted: {', '.join(STRATEGIES)})"
        return p
    missing = [k for k, v in need.items() if v is None]
    p.terms = {k: v for k, v in need.items() if v is not None}
    if missing:
        p.reason = f"not measured: {', '.join(missing)}"
        return p
    p.step_time_s = t
    p.samples_per_s = inp.batch / t if t > 0 else None
    base = inp.batch_1 / inp.t_1 if inp.t_1 > 0 else None
    if p.samples_per_s and base:
        p.speedup = p.samples_per_s / base
        p.efficiency = p.speedup / n
    p.mem_per_device = memory(strategy, inp)
    return p


def memory(strategy: str, inp: Inputs) -> int | None:
    """Training bytes per device (None without the parameter count)."""
    if not inp.params:
        return None
    static = static_bytes(inp)
    # tp: a lower bound (its embeddings, norms and head are replicated)
    if strategy in ("fsdp", "tp", "pp") and inp.n > 1:
        static = -(-static // inp.n)
    if strategy == "dp" and not inp.on_gpu:
        return static + (inp.activations_1 or 0)
    act = 0 if inp.activations_1 is None else inp.activations_1 * inp.batch // (
        inp.n * max(inp.batch_1, 1))
    if strategy == "pp" and inp.schedule == "1f1b" and inp.chunks > inp.n:
        act = act * inp.n // inp.chunks  # at most N micro-batches in flight per stage
    return static + act


def short_of(measured: float | None, predicted: float | None, noise: float = 0.0) -> bool:
    """True when a measured speedup falls well short of its prediction: below it by more than
    SHORT_MARGIN plus the measurement's own noise."""
    if measured is None or not predicted:
        return False
    return measured < predicted * (1 - SHORT_MARGIN - noise)


PREDICT_REMEDY = ("(other load while t_1 was measured, or threads spinning on shared cores): "
                  "measure it again on a quiet machine (`gputui predict ... --measure-again`)")


def impossible(p: Prediction, inp: Inputs, cores: int, noise_1: float | None = None) -> list[str]:
    """Why a predicted speedup is no result, by the rules compare and sweep apply to measured
    ones (:func:`gputui.core.trust.flags`): an efficiency above 100 % says t_1, the measured
    one-device step, was slow, not that N devices would be fast. ``noise_1``: t_1's noise."""
    from types import SimpleNamespace

    if p.n <= 1 or p.speedup is None:
        return []
    kind = "cuda" if inp.on_gpu else "cpu"
    shared = p.strategy in ("scratch", "dp")  # one process drives every device
    row = SimpleNamespace(id=f"{p.strategy} on {p.n}", devices=p.n, steady=True,
                          strategy=p.strategy, noise=None,
                          device_names=[f"{kind}:{i}" for i in range(p.n)],
                          threads=cores if shared else max(1, cores // p.n), cores=cores)
    base = SimpleNamespace(id=f"t_1 ({inp.t_1 * 1000:,.1f} ms a step on one device)",
                           steady=True, noise=noise_1)
    return flags(row, base, p.speedup, remedy=PREDICT_REMEDY)
