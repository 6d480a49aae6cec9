"""The event schema shared by the training processes, the run record, the printer and the TUI.

Every event is a small frozen dataclass. On disk each is one JSON line whose ``type`` field
names the class (``Event.kind``); :func:`event_from_dict` turns a line back into the event.
This module imports nothing heavy (no torch, no textual), so any process can use it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from gputui.core.breakdown import Breakdown, mean, mean_value
from gputui.core.config import RunConfig, from_record


def acc_text(acc: float) -> str:
    """A test accuracy as every screen and table shows it: a percentage, '95.12%' (records,
    JSON and CSV keep the fraction)."""
    return f"{acc * 100:.2f}%"


def plural(n: int, word: str) -> str:
    """'1 epoch', '2 epochs', '0 runs'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---------------------------------------------------------------- a metered step's rows
# What a strategy reports of a metered step: one :class:`DeviceStep` per device (or rank)
# inside one :class:`StepReport`. Frozen and torch-free: the loop puts the rows into
# ``StepMetrics.per_device``, and the record, the printer, compare and the app read their
# fields. On disk a row is a dict of its measured fields (``DeviceStep.to_dict``); records
# written before these classes existed hold the same keys, so ``from_dict`` reads both.


@dataclass(frozen=True)
class DeviceStep:
    """One device's (or rank's) metered step. None: not measured there."""

    device: str  # "cuda:0", "cpu:1"; another machine's rank: "cpu:0@node1"
    samples: int = 0  # examples this device trained on in the step
    compute_s: float | None = None  # its forward and backward (rank: up to the end of backward)
    # ddp/fsdp/tp: the rank's own forward and backward (up to its last gradient), the
    # collectives inside them left out: what it did before any collective evened it out
    forward_s: float | None = None
    backward_s: float | None = None
    breakdown: Breakdown | None = None  # where its step went (gputui.core.breakdown)
    samples_per_s: float | None = None  # samples / compute_s (the loop fills it in)
    step_time_s: float | None = None  # the rank's whole step (ddp/fsdp)
    rank: int | None = None  # ddp/fsdp: the process's global rank
    pid: int | None = None  # ddp/fsdp: the rank's process
    rss: int | None = None  # ddp/fsdp: the rank's resident memory, bytes
    mem_alloc: int | None = None  # CUDA: torch's allocated bytes at the log interval
    mem_reserved: int | None = None  # CUDA: torch's reserved bytes
    comm_s: float | None = None  # the time some timed collective was in flight
    comm_calls: int | None = None  # how many collectives were timed
    comm_bytes: int | None = None  # bytes the gradient all-reduce moved (ddp)
    comm_gbps: float | None = None  # comm_bytes / comm_s, GB/s (ddp)
    # seconds each kind of collective was in flight ("ddp all-reduce", "fsdp all-gather",
    # "fsdp reduce-scatter", "tp all-reduce"; pp's "pp send" and "pp recv", estimated)
    collectives: dict | None = None
    # bytes this rank sent in each named collective that counts them (ep's "ep dispatch",
    # "ep combine", "ep expert all-reduce")
    collective_bytes: dict | None = None
    # activation checkpointing: the seconds backward spent recomputing the blocks' forward
    # (part of compute)
    recompute_s: float | None = None
    # pp: the stage's pipeline (gputui.train.strategies.pp_meter); None for other strategies
    stage: int | None = None  # its place in the pipeline, 0 = the first
    pipeline_s: float | None = None  # the schedule's span on this stage
    bubble_s: float | None = None  # idle in it waiting on the other stages, transfers excluded
    bubble_share: float | None = None  # bubble_s / pipeline_s
    bubble_theory: float | None = None  # (p - 1) / (m + p - 1): equal stages, free sends
    send_s: float | None = None  # the transfer of the messages it sent (estimated)
    recv_s: float | None = None  # ... and of those it received
    p2p_bytes: int | None = None  # bytes it sent and received
    p2p_messages: int | None = None  # messages it sent and received

    def to_dict(self) -> dict[str, Any]:
        """The record's form: the measured fields only (the breakdown as its own dict)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.to_dict() if isinstance(value, Breakdown) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceStep:
        """From the record's form, this version's or an older one (unknown keys ignored)."""
        if not isinstance(data, dict) or not isinstance(data.get("device"), str):
            raise TypeError(f"not a device's step: {data!r}")
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if isinstance(kwargs.get("breakdown"), dict):
            kwargs["breakdown"] = Breakdown.from_dict(kwargs["breakdown"])
        return cls(**kwargs)

    def with_memory(self, alloc: int | None, reserved: int | None) -> DeviceStep:
        """This row with the allocator's figures, where the strategy gave none."""
        if self.mem_alloc is not None or alloc is None:
            return self
        return replace(self, mem_alloc=alloc, mem_reserved=reserved)


@dataclass(frozen=True)
class StepReport:
    """A strategy's metered step: its seconds on the first device's clock, the seconds some
    communication ran (None: the strategy times none) and every device's row, in order."""

    step_s: float
    comm_s: float | None
    devices: tuple[DeviceStep, ...]

    def comm_share(self) -> float | None:
        """The share of the step spent communicating (None where not measured)."""
        if self.comm_s is None or not self.step_s:
            return None
        return min(1.0, self.comm_s / self.step_s)

    def breakdown(self) -> Breakdown | None:
        """The devices' breakdowns, part by part, averaged (None: none measured)."""
        return mean(d.breakdown for d in self.devices)

    def comm_gbps(self) -> float | None:
        """The mean all-reduce bandwidth over the devices that measured one."""
        return mean_value(d.comm_gbps for d in self.devices)


@dataclass(frozen=True)
class Event:
    """Base of every event; ``t`` is the wall-clock time (seconds since the epoch)."""

    kind: ClassVar[str] = "event"
    t: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the event's ``type`` first."""
        out: dict[str, Any] = {"type": self.kind}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        return out

    def to_json(self) -> str:
        """One line of JSON (no newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), default=_json_default)

    @classmethod
    def from_fields(cls, kwargs: dict[str, Any]) -> Event:
        """The event from its record's fields (a class whose fields are typed objects turns
        their record form back into them here)."""
        return cls(**kwargs)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@dataclass(frozen=True)
class RunStarted(Event):
    """The run began: its id, resolved config and the devices it uses. The record holds the
    config's TOML-shaped dict; reading it back gives the RunConfig (``from_record``)."""

    kind: ClassVar[str] = "run_started"
    run_id: str
    config: RunConfig
    devices: tuple  # tuple of dicts: {"name": "cpu:0", "kind": "cpu", "label": "..."}
    strategy: str
    world_size: int = 1
    notes: tuple = ()  # plain-language remarks, e.g. "DataParallel has no CPU mode"

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["config"] = self.config.to_dict()
        return out

    @classmethod
    def from_fields(cls, kwargs: dict[str, Any]) -> Event:
        kwargs["config"] = from_record(kwargs.get("config"))
        return cls(**kwargs)


@dataclass(frozen=True)
class InitDone(Event):
    """Set-up finished: time spent before the first step, apart from step time."""

    kind: ClassVar[str] = "init_done"
    seconds: float  # the launch (the parent's t_launch) to ready to train
    import_s: float = 0.0
    data_s: float = 0.0
    model_s: float = 0.0
    compile_s: float = 0.0  # torch.compile's warm-up (run.compile), apart from model_s
    train_samples: int = 0
    test_samples: int = 0
    steps_per_epoch: int = 0
    params: int = 0
    threads: int = 0  # torch intra-op threads of this process (0: not recorded)
    cores: int = 0  # cores this process may run on (0: not recorded)
    # how its OpenMP threads wait (gputui.core.ompwait.described; "": not recorded)
    omp_wait: str = ""
    task: str = "classify"  # or "lm": language modelling (loss, perplexity, tokens/s)
    tokens_per_sample: int = 0  # lm: data.context
    baseline_loss: float | None = None  # lm: the unigram baseline, nats per token
    # the launch to this process running the run's code: the host's (or ranks') spawn, the
    # elastic agent, the interpreter's start (0.0 in records from before it was kept)
    launch_s: float = 0.0


def init_parts(ev: InitDone, digits: int = 1) -> list[tuple[str, float]]:
    """Where an InitDone's seconds went, rounded to ``digits``: launch, import, data, model,
    compile (when there was one) and "other" (the rest), which add up to the rounded total."""
    parts = [("launch", ev.launch_s), ("import", ev.import_s), ("data", ev.data_s),
             ("model", ev.model_s)] + ([("compile", ev.compile_s)] if ev.compile_s else [])
    shown = [(name, round(max(0.0, v), digits)) for name, v in parts]
    other = round(round(ev.seconds, digits) - sum(v for _, v in shown), digits)
    return shown + [("other", max(0.0, other))]


def init_text(ev: InitDone, digits: int = 1) -> str:
    """'13.4 s (launch 8.9 s, import 0.0 s, data 2.3 s, model 0.0 s, other 2.2 s)'."""
    parts = ", ".join(f"{name} {v:.{digits}f} s" for name, v in init_parts(ev, digits))
    return f"{ev.seconds:.{digits}f} s ({parts})"


@dataclass(frozen=True)
class StepMetrics(Event):
    """Training metrics at the log interval (the only place the loop syncs for ``.item()``)."""

    kind: ClassVar[str] = "step"
    epoch: int  # 1-based
    step: int  # 1-based within the epoch
    global_step: int
    steps_per_epoch: int
    loss: float  # mean loss over the steps since the previous StepMetrics
    samples_per_s: float  # over the steps since the previous StepMetrics
    step_time_s: float  # mean wall time of one step over that window
    lr: float
    comm_share: float | None = None  # share of step time spent communicating, when measured
    # the metered step of each device (or rank): gputui.core.events.DeviceStep, its samples,
    # compute, breakdown, memory and timed communication; () when nothing was metered
    per_device: tuple[DeviceStep, ...] = ()
    flops_per_s: float | None = None  # FlopsInfo.flops_per_step x steps/s over the window
    mfu: float | None = None  # flops_per_s / FlopsInfo.peak_flops (0..1)
    # where the metered step's time went, the mean of the devices' breakdowns
    # (gputui.core.breakdown); None when the strategy measured none
    breakdown: Breakdown | None = None
    # the gradient all-reduce bandwidth the metered step achieved, GB/s (1e9 bytes/s, as
    # bench-comm's algbw): its bytes over the time a bucket was in flight, mean over the
    # ranks (each row holds its own comm_bytes, comm_s, comm_gbps); ddp only
    comm_gbps: float | None = None
    tokens_per_s: float | None = None  # lm: samples_per_s x tokens per sample (data.context)
    # a mixture of experts: its routing over the window, summed over the MoE layers and every
    # rank: {"routed": [assignments per expert], "kept": [... within the capacity], "dropped",
    # "sent": [[each data-parallel rank's assignments per expert]], "forwards", "layers", "ep",
    # "experts", "top_k"} (gputui.train.moe.read_stats)
    moe: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["per_device"] = [row.to_dict() for row in self.per_device]
        out["breakdown"] = self.breakdown.to_dict() if self.breakdown is not None else None
        return out

    @classmethod
    def from_fields(cls, kwargs: dict[str, Any]) -> Event:
        rows = kwargs.get("per_device", ())
        kwargs["per_device"] = tuple(DeviceStep.from_dict(r) for r in rows)
        if isinstance(kwargs.get("breakdown"), dict):
            kwargs["breakdown"] = Breakdown.from_dict(kwargs["breakdown"])
        return cls(**kwargs)


@dataclass(frozen=True)
class EpochEnd(Event):
    """An epoch finished: its time, mean train loss and its test score: accuracy when the
    task is "classify" (and the test set's mean loss, drawn beside the training loss),
    validation loss per token (perplexity = exp of it) when "lm"."""

    kind: ClassVar[str] = "epoch_end"
    epoch: int
    epochs: int
    seconds: float  # training time of the epoch (evaluation excluded)
    train_loss: float
    test_acc: float  # NaN for a language model, which has no accuracy
    samples_per_s: float
    eval_s: float = 0.0
    task: str = "classify"  # or "lm"
    val_loss: float | None = None  # lm: mean validation loss per token, nats
    tokens_per_s: float | None = None  # lm: samples_per_s x tokens per sample
    test_loss: float | None = None  # classify: mean loss per test example (None before it)


@dataclass(frozen=True)
class DeviceSample(Event):
    """One telemetry reading of one device; None means "not available"."""

    kind: ClassVar[str] = "device_sample"
    device: str  # "cuda:0" (CUDA numbering of the run) or "cpu:0" (a virtual device)
    name: str = ""
    util: float | None = None  # percent
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pid: int | None = None  # for CPU virtual devices: the rank's process
    cpu_percent: float | None = None
    rss: int | None = None
    energy_j: float | None = None  # the GPU's energy counter (since the driver loaded)
    sm_active: float | None = None  # GPM (Hopper+), percent: SMs busy since the last sample
    sm_occupancy: float | None = None  # GPM: warps resident against the maximum
    tensor_active: float | None = None  # GPM: time any tensor core op ran


@dataclass(frozen=True)
class MemoryRow:
    """One device's own training memory, in bytes: what it holds for training, counted from
    its tensors (a shard counts its own bytes), and on CUDA the allocator's figures."""

    device: str
    params: int | None = None
    grads: int | None = None
    optim: int | None = None
    experts: int = 0  # a mixture of experts: the part of ``params`` that is this rank's experts
    # the peak of what autograd saved for backward on the run's first step (None: not measured)
    activations: int | None = None
    alloc: int | None = None  # CUDA only: allocated now,
    peak: int | None = None  # the peak since the epoch began,
    reserved: int | None = None  # and reserved by the caching allocator

    def terms(self) -> tuple[int | None, int | None, int | None, int | None]:
        """The memory model's four terms: params, grads, optim, activations."""
        return self.params, self.grads, self.optim, self.activations

    def predicted(self) -> int | None:
        """What the memory model adds up for this device (the terms it has), None when the
        parameters, gradients or optimizer state were not counted."""
        terms = self.terms()
        if not all(isinstance(t, int) for t in terms[:3]):
            return None
        return sum(t for t in terms if isinstance(t, int))

    def to_dict(self) -> dict[str, Any]:
        """The record's form: "experts" only when there are some, the allocator's figures
        only where an allocator reported them (as records always held it)."""
        out: dict[str, Any] = {"device": self.device, "params": self.params,
                               "grads": self.grads, "optim": self.optim}
        if self.experts:
            out["experts"] = self.experts
        out["activations"] = self.activations
        for name in ("alloc", "peak", "reserved"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryRow:
        """A row of a record (unknown keys ignored, a figure that is no integer read as
        not counted)."""
        def count(name: str) -> int | None:
            value = data.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(device=str(data.get("device") or ""), params=count("params"),
                   grads=count("grads"), optim=count("optim"), experts=count("experts") or 0,
                   activations=count("activations"), alloc=count("alloc"), peak=count("peak"),
                   reserved=count("reserved"))


@dataclass(frozen=True)
class MemoryReport(Event):
    """Each device's own training memory (:class:`MemoryRow`) after the run's first step and
    at each epoch's end."""

    kind: ClassVar[str] = "memory"
    epoch: int
    per_device: tuple[MemoryRow, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["per_device"] = [row.to_dict() for row in self.per_device]
        return out

    @classmethod
    def from_fields(cls, kwargs: dict[str, Any]) -> Event:
        kwargs["per_device"] = tuple(MemoryRow.from_dict(r) for r in kwargs.get("per_device", ())
                                     if isinstance(r, dict))
        return cls(**kwargs)


@dataclass(frozen=True)
class FlopsInfo(Event):
    """What the run's FLOP/s are measured against, once before the first step:
    ``flops_per_step`` (one forward and backward of a global batch, torch's flop counter),
    ``peak_flops`` (dense FLOP/s of all the run's devices together for ``dtype``) and
    where the peak comes from (``source``: a data sheet, or a measured matmul)."""

    kind: ClassVar[str] = "flops"
    flops_per_step: int
    peak_flops: float | None = None
    dtype: str = "fp32"
    units: int = 1  # devices (GPUs, or CPU processes) the peak adds up
    source: str = ""
    # a mixture of experts: flops_per_step counts the ACTIVE parameters (top_k experts a
    # token); the model's parameters in all and those one token uses (0: a dense model)
    params_total: int = 0
    params_active: int = 0


@dataclass(frozen=True)
class LogLine(Event):
    """A line of the run's own output: info, warning or error."""

    kind: ClassVar[str] = "log"
    level: str  # "info" | "warning" | "error"
    message: str


@dataclass(frozen=True)
class RunFinished(Event):
    """The run completed every epoch."""

    kind: ClassVar[str] = "run_finished"
    seconds: float


@dataclass(frozen=True)
class RunFailed(Event):
    """The run ended with an error; ``reason`` is one line, ``detail`` may hold a traceback."""

    kind: ClassVar[str] = "run_failed"
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class RunStopped(Event):
    """The run was stopped on request before it finished."""

    kind: ClassVar[str] = "run_stopped"
    reason: str = "stopped by user"
    # True when the processes were killed (no graceful stop, nothing kept after the last
    # checkpoint): the record's status is then "killed", not "stopped".
    killed: bool = False


@dataclass(frozen=True)
class Stalled(Event):
    """The ranks' collectives stopped moving for ``threshold_s``: ``message`` names the rank
    that is behind and where ("rank 1 never entered all-reduce #212 of step 54; rank 0 waited
    61 s"); ``ranks`` holds every rank's count as its node's host last read it (rank, pid,
    step, entered, left, kind, bytes, process). The run is stopped after it
    (gputui.core.hang)."""

    kind: ClassVar[str] = "stalled"
    message: str
    threshold_s: float
    behind: tuple = ()  # the ranks named
    ranks: tuple = ()  # dicts, one a rank seen by this node's host
    traces: tuple = ()  # the ranks' dumps of torch's flight recorder (ranks/fr-trace-N.pkl)


TERMINAL_KINDS = frozenset({RunFinished.kind, RunFailed.kind, RunStopped.kind})


class Status(str, enum.Enum):
    """A run's status, decided once from the event its record ends with (:meth:`of`), and
    read by the launcher's handle, the record's summary, the CLI's exit code and the app.
    The values are the strings records hold ("status" in summary.json), so old records read."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"  # on request, gracefully: the checkpoint kept
    KILLED = "killed"  # its processes killed: nothing kept after the last checkpoint

    @classmethod
    def of(cls, terminal: Event | None) -> Status:
        """The status a run has once ``terminal`` (its last event) arrived: RUNNING for
        None or any event that does not end a run."""
        if isinstance(terminal, RunFinished):
            return cls.FINISHED
        if isinstance(terminal, RunFailed):
            return cls.FAILED
        if isinstance(terminal, RunStopped):
            return cls.KILLED if terminal.killed else cls.STOPPED
        return cls.RUNNING

    @property
    def exit_code(self) -> int:
        """The headless command's exit status: 0 for a finished run, 1 for any other end (a
        stop by signal is 128 + the signal, decided by the CLI, which took the signal)."""
        return 0 if self is Status.FINISHED else 1

    def __str__(self) -> str:
        return self.value

_REGISTRY: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (RunStarted, InitDone, StepMetrics, EpochEnd, DeviceSample, LogLine,
                RunFinished, RunFailed, RunStopped, MemoryReport, FlopsInfo, Stalled)
}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from its dict form; unknown fields are ignored (newer writers)."""
    data = dict(data)
    cls = _REGISTRY.get(data.pop("type", ""))
    if cls is None:
        raise ValueError(f"unknown event type in {data!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in data.items() if k in names}
    return cls.from_fields(kwargs)


def is_terminal(event: Event) -> bool:
    """True for the events that end a run (finished, failed, stopped)."""
    return event.kind in TERMINAL_KINDS
