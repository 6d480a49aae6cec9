"""The run record: ``runs/<run-id>/{config.toml, events.jsonl, telemetry.jsonl, summary.json}``.

Names, reading and the summary. Events are appended one JSON line at a time as they happen
(by the one writer, ``gputui.core.recorder``), so a crash loses at most the step in flight.
The summary is a pure function of the events (``summarize``), so it can always be rebuilt from
a record whose writer died.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from gputui.core import safeio
from gputui.core.events import (EpochEnd, Event, InitDone, LogLine, RunFailed, RunStarted,
                                 RunStopped, Status, StepMetrics, event_from_dict, is_terminal)
from gputui.core.filewrite import AppendLog, WriteFailed, write_atomic
from gputui.core.memcheck import memory_check
from gputui.core.scores import perplexity
from gputui.core.steady import steady_figures

ENV_RUNS_DIR = "GPUTUI_RUNS_DIR"
RESERVE_NAME = ".space-reserve"
CHECKPOINT_NAME = "checkpoint.pt"  # the run's one checkpoint (written by train/checkpoint.py)
RESERVE_BYTES = 32 * 1024  # room for the terminal event and summary.json on a full disk


def default_runs_dir() -> Path:
    """``$GPUTUI_RUNS_DIR`` or ``./runs``."""
    return Path(os.environ.get(ENV_RUNS_DIR) or "runs")


def new_run_dir(runs_dir: str | Path | None, name: str, tag: str = "") -> tuple[str, Path]:
    """Create a fresh run folder; the id sorts by start time and names the run (and ``tag``,
    e.g. a SLURM job's "slurm123", when given)."""
    base = Path(runs_dir) if runs_dir else default_runs_dir()
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40] or "run"
    safe += f"-{tag}" if tag else ""
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{secrets.token_hex(2)}"
    path = base / run_id
    try:
        path.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    return run_id, path


def reserve_space(run_dir: str | Path) -> None:
    """Set aside a little disk space in the run folder (a hidden file of zeros), freed by
    :func:`release_space` just before the record's last writes: on a disk that fills up during
    the run, the terminal event and summary.json still fit. WriteFailed when it cannot."""
    write_atomic(Path(run_dir) / RESERVE_NAME, bytes(RESERVE_BYTES))


def release_space(run_dir: str | Path) -> None:
    """Free the space :func:`reserve_space` set aside (nothing when it is gone already)."""
    try:
        (Path(run_dir) / RESERVE_NAME).unlink()
    except OSError:
        pass


class EventLog:
    """Append-only JSON-lines writer; each event is one whole line on disk or none (a failed
    append is cut back and raises WriteFailed, see ``filewrite.AppendLog``)."""

    def __init__(self, path: str | Path, hint: str = ""):
        self.path = Path(path)
        self._log = AppendLog(self.path, hint)

    def write(self, event: Event) -> None:
        self._log.append(event.to_json() + "\n")

    def close(self) -> None:
        self._log.close()


def read_events(run_dir: str | Path, name: str = "events.jsonl") -> list[Event]:
    """Every readable event of a record; a torn last line (a crash mid-write) is skipped, and
    so is a line too long to be an event. A missing file gives no events; a file that cannot
    be read (a folder, a fifo, no permission) raises OSError (``safeio.Unreadable`` for the
    wrong kind of file). Never blocks: only a regular file is read, as a stream."""
    out: list[Event] = []
    try:
        lines = safeio.iter_lines(Path(run_dir) / name)
        for line in lines:
            try:
                out.append(event_from_dict(json.loads(line)))
            except (ValueError, TypeError):
                continue
    except FileNotFoundError:
        pass
    return out


def _num(v: Any) -> float | None:
    """A figure read back from JSON: the number as written (an int stays an int, so it is
    written back the same), or None (missing, null, or not a number)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _fig(v: Any) -> float:
    n = _num(v)
    return 0.0 if n is None else n


def _int_or_none(v: Any) -> int | None:
    """A count read back from JSON, or None (missing, null, not a finite number)."""
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _int(v: Any) -> int:
    n = _int_or_none(v)
    return 0 if n is None else n


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _strs(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else ()


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, (list, tuple)) else []


@dataclass(frozen=True)
class EpochSummary:
    """One epoch of a summary's ``per_epoch``. A language model's (``lm``) has no accuracy
    (``test_acc`` None) but a validation loss and tokens/s; a classifier's has ``test_loss``
    once its evaluation reports one."""

    epoch: int
    seconds: float
    train_loss: float | None
    test_acc: float | None
    samples_per_s: float
    lm: bool = False
    val_loss: float | None = None
    tokens_per_s: float | None = None
    test_loss: float | None = None

    @classmethod
    def of(cls, ev: EpochEnd) -> EpochSummary:
        lm = ev.task == "lm"
        return cls(epoch=ev.epoch, seconds=ev.seconds, train_loss=ev.train_loss,
                   test_acc=None if lm else ev.test_acc, samples_per_s=ev.samples_per_s,
                   lm=lm, val_loss=ev.val_loss if lm else None,
                   tokens_per_s=ev.tokens_per_s if lm else None,
                   test_loss=None if lm else ev.test_loss)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "seconds": self.seconds,
                               "train_loss": self.train_loss, "test_acc": self.test_acc,
                               "samples_per_s": self.samples_per_s}
        if self.lm:
            out.update(val_loss=self.val_loss, tokens_per_s=self.tokens_per_s)
        elif self.test_loss is not None:
            out["test_loss"] = self.test_loss
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpochSummary:
        return cls(epoch=_int(d.get("epoch")), seconds=_fig(d.get("seconds")),
                   train_loss=_num(d.get("train_loss")), test_acc=_num(d.get("test_acc")),
                   samples_per_s=_fig(d.get("samples_per_s")), lm="val_loss" in d,
                   val_loss=_num(d.get("val_loss")), tokens_per_s=_num(d.get("tokens_per_s")),
                   test_loss=_num(d.get("test_loss")))


@dataclass(frozen=True)
class SteadyFigures:
    """The steady state of a run (warm-up excluded, ``gputui.core.steady``): what tables and
    summaries print. ``noise`` None: one window, unknown; ``tokens_per_s`` only for a
    language model."""

    samples_per_s: float
    step_time_s: float
    steps: int
    windows: int
    warmup_steps: int
    noise: float | None = None
    tokens_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples_per_s": self.samples_per_s,
                               "step_time_s": self.step_time_s, "steps": self.steps,
                               "windows": self.windows, "warmup_steps": self.warmup_steps,
                               "noise": self.noise}
        if self.tokens_per_s is not None:
            out["tokens_per_s"] = self.tokens_per_s
        return out

    @classmethod
    def from_dict(cls, d: Any) -> SteadyFigures | None:
        if not isinstance(d, dict):
            return None
        return cls(samples_per_s=_fig(d.get("samples_per_s")),
                   step_time_s=_fig(d.get("step_time_s")), steps=_int(d.get("steps")),
                   windows=_int(d.get("windows")), warmup_steps=_int(d.get("warmup_steps")),
                   noise=_num(d.get("noise")), tokens_per_s=_num(d.get("tokens_per_s")))


@dataclass(frozen=True)
class MemoryCheck:
    """One device's allocator peak against the memory terms predicted for it (bytes)."""

    device: str
    peak: int
    predicted: int
    diff: int

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "peak": self.peak, "predicted": self.predicted,
                "diff": self.diff}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryCheck:
        return cls(device=_str(d.get("device")), peak=_int(d.get("peak")),
                   predicted=_int(d.get("predicted")), diff=_int(d.get("diff")))


UNREADABLE = "unreadable"  # the status text of a record that cannot be read at all


@dataclass(frozen=True)
class RunSummary:
    """A run's summary (``summary.json``): a pure function of its events (:func:`summarize`).

    A group of fields is there when the record has the event it comes from: ``run_id`` None
    means no RunStarted, ``task`` "" no InitDone, ``per_epoch`` empty no epoch. ``to_dict``
    writes exactly the keys the record has (the on-disk form is unchanged from the dict this
    class replaced); ``from_dict`` reads any record, old or damaged (missing keys: None or
    the default; unknown keys ignored). ``unreadable``: nothing of the record could be read
    (``reason`` says why); its status text is then "unreadable"."""

    status: Status = Status.RUNNING
    reason: str = ""
    epochs_done: int = 0
    epochs: int | None = None
    per_epoch: tuple[EpochSummary, ...] = ()
    unreadable: bool = False
    # RunStarted
    run_id: str | None = None
    started_t: float | None = None
    strategy: str = ""
    world_size: int = 0
    devices: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # the RunStarted's notes, then info and warning lines
    model: str = ""
    dataset: str = ""
    # InitDone
    task: str = ""
    init_s: float | None = None
    params: int = 0
    train_samples: int = 0
    steps_per_epoch: int = 0
    threads: int = 0
    cores: int = 0
    omp_wait: str = ""
    tokens_per_sample: int | None = None  # lm
    baseline_loss: float | None = None  # lm
    # the last StepMetrics
    last_loss: float | None = None
    # over the epochs (per_epoch not empty)
    time_per_epoch_s: float | None = None
    samples_per_s: float | None = None
    train_loss: float | None = None
    test_acc: float | None = None  # None for a language model
    best_test_acc: float | None = None
    val_loss: float | None = None  # lm
    best_val_loss: float | None = None
    val_ppl: float | None = None
    tokens_per_s: float | None = None
    steady: SteadyFigures | None = None
    time_per_epoch_steady_s: float | None = None
    total_s: float | None = None  # the first event to the last
    memory_check: tuple[MemoryCheck, ...] = ()

    @property
    def status_text(self) -> str:
        """"finished", "failed", ..., or "unreadable"."""
        return UNREADABLE if self.unreadable else self.status.value

    @property
    def lm(self) -> bool:
        return self.task == "lm"

    def to_dict(self) -> dict[str, Any]:
        """The summary.json form (the keys this record has, see the class)."""
        s: dict[str, Any] = {"status": self.status_text, "reason": self.reason,
                             "epochs_done": self.epochs_done, "epochs": self.epochs,
                             "per_epoch": [e.to_dict() for e in self.per_epoch]}
        if self.unreadable:
            return s
        if self.run_id is not None:
            s.update(run_id=self.run_id, started_t=self.started_t, strategy=self.strategy,
                     world_size=self.world_size, devices=list(self.devices),
                     model=self.model, dataset=self.dataset)
        if self.run_id is not None or self.notes:
            s["notes"] = list(self.notes)
        if self.task:
            s.update(init_s=self.init_s, params=self.params, train_samples=self.train_samples,
                     steps_per_epoch=self.steps_per_epoch, threads=self.threads,
                     cores=self.cores, omp_wait=self.omp_wait, task=self.task)
            if self.lm:
                s.update(tokens_per_sample=self.tokens_per_sample,
                         baseline_loss=self.baseline_loss)
        if self.last_loss is not None:
            s["last_loss"] = self.last_loss
        if self.per_epoch:
            s.update(time_per_epoch_s=self.time_per_epoch_s, samples_per_s=self.samples_per_s,
                     train_loss=self.train_loss, test_acc=self.test_acc,
                     best_test_acc=self.best_test_acc)
            if self.lm:
                s.update(val_loss=self.val_loss, best_val_loss=self.best_val_loss,
                         val_ppl=self.val_ppl, tokens_per_s=self.tokens_per_s)
        s["steady"] = self.steady.to_dict() if self.steady else None
        if self.time_per_epoch_steady_s is not None:
            s["time_per_epoch_steady_s"] = self.time_per_epoch_steady_s
        if self.total_s is not None:
            s["total_s"] = self.total_s
        s["memory_check"] = [m.to_dict() for m in self.memory_check]
        return s

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSummary:
        """Read a summary.json of any age (see the class)."""
        text = _str(d.get("status")) or Status.RUNNING.value
        try:
            status, unreadable = Status(text), False
        except ValueError:  # "unreadable", or a status no writer of gputui wrote
            status, unreadable = Status.RUNNING, True
        epochs = [EpochSummary.from_dict(e) for e in _dicts(d.get("per_epoch"))]
        checks = [MemoryCheck.from_dict(m) for m in _dicts(d.get("memory_check"))]
        run_id = d.get("run_id")
        return cls(
            status=status, unreadable=unreadable, reason=_str(d.get("reason")),
            epochs_done=_int(d.get("epochs_done")),
            epochs=_int_or_none(d.get("epochs")),
            per_epoch=tuple(epochs),
            run_id=run_id if isinstance(run_id, str) else None,
            started_t=_num(d.get("started_t")), strategy=_str(d.get("strategy")),
            world_size=_int(d.get("world_size")), devices=_strs(d.get("devices")),
            notes=_strs(d.get("notes")), model=_str(d.get("model")),
            dataset=_str(d.get("dataset")), task=_str(d.get("task")),
            init_s=_num(d.get("init_s")), params=_int(d.get("params")),
            train_samples=_int(d.get("train_samples")),
            steps_per_epoch=_int(d.get("steps_per_epoch")), threads=_int(d.get("threads")),
            cores=_int(d.get("cores")), omp_wait=_str(d.get("omp_wait")),
            tokens_per_sample=_int_or_none(d.get("tokens_per_sample")),
            baseline_loss=_num(d.get("baseline_loss")), last_loss=_num(d.get("last_loss")),
            time_per_epoch_s=_num(d.get("time_per_epoch_s")),
            samples_per_s=_num(d.get("samples_per_s")), train_loss=_num(d.get("train_loss")),
            test_acc=_num(d.get("test_acc")), best_test_acc=_num(d.get("best_test_acc")),
            val_loss=_num(d.get("val_loss")), best_val_loss=_num(d.get("best_val_loss")),
            val_ppl=_num(d.get("val_ppl")), tokens_per_s=_num(d.get("tokens_per_s")),
            steady=SteadyFigures.from_dict(d.get("steady")),
            time_per_epoch_steady_s=_num(d.get("time_per_epoch_steady_s")),
            total_s=_num(d.get("total_s")), memory_check=tuple(checks))

    @classmethod
    def unreadable_record(cls, reason: str) -> RunSummary:
        """The summary of a record of which nothing can be read, ``reason`` saying why."""
        return cls(unreadable=True, reason=reason)


def summarize(events: Iterable[Event]) -> RunSummary:
    """The run's summary: status, timing, throughput, accuracy (a pure function of events)."""
    events = list(events)
    f: dict[str, Any] = {}  # RunSummary's fields, as the events give them
    notes: list[str] = []
    per_epoch: list[EpochSummary] = []
    first_t: float | None = None
    last_t = 0.0
    for ev in events:
        first_t = ev.t if first_t is None else first_t
        last_t = ev.t
        if isinstance(ev, RunStarted):
            notes = list(ev.notes)
            f.update(run_id=ev.run_id, started_t=ev.t, strategy=ev.strategy,
                     world_size=ev.world_size, devices=tuple(d["name"] for d in ev.devices),
                     epochs=ev.config.run.epochs, model=ev.config.model.label,
                     dataset=ev.config.data.label)
        elif isinstance(ev, InitDone):
            f.update(init_s=ev.seconds, params=ev.params, train_samples=ev.train_samples,
                     steps_per_epoch=ev.steps_per_epoch, threads=ev.threads, cores=ev.cores,
                     omp_wait=ev.omp_wait, task=ev.task)
            if ev.task == "lm":
                f.update(tokens_per_sample=ev.tokens_per_sample, baseline_loss=ev.baseline_loss)
        elif isinstance(ev, EpochEnd):
            per_epoch.append(EpochSummary.of(ev))
            f["epochs_done"] = ev.epoch
        elif isinstance(ev, StepMetrics):
            f["last_loss"] = ev.loss
        elif isinstance(ev, LogLine) and ev.level in ("info", "warning"):
            notes.append(ev.message)
        elif is_terminal(ev):
            f["status"] = Status.of(ev)
            if isinstance(ev, (RunFailed, RunStopped)):
                f["reason"] = ev.reason
    lm = f.get("task") == "lm"
    if per_epoch:
        # the epochs this run trained whole: a run resumed mid-epoch ends its first epoch
        # after a few steps (2 of 32: 0.26 s, where the next took 3.91), which the average
        # time an epoch would count as one. An epoch's samples are its steps times the
        # batch, so a whole one trained the most (whatever the last batch dropped); one of
        # nine tenths of that or more counts as whole
        trained = [e.samples_per_s * e.seconds for e in per_epoch]
        most = max(trained)
        timed = [e for e, n in zip(per_epoch, trained, strict=True) if n >= 0.9 * most]
        n = len(timed)
        last = per_epoch[-1]
        f.update(time_per_epoch_s=sum(e.seconds for e in timed) / n,
                 samples_per_s=sum(e.samples_per_s for e in timed) / n,
                 train_loss=last.train_loss)
        if lm:
            val = [e.val_loss for e in per_epoch]
            f.update(test_acc=None, best_test_acc=None, val_loss=last.val_loss,
                     best_val_loss=min(val),  # type: ignore[type-var]  # lm epochs have one
                     val_ppl=perplexity(last.val_loss),
                     tokens_per_s=f["samples_per_s"] * (f.get("tokens_per_sample") or 0))
        else:
            f.update(test_acc=last.test_acc,
                     best_test_acc=max(e.test_acc for e in per_epoch))  # type: ignore[type-var]
    # the steady state (warm-up excluded, gputui.core.steady): what tables and summaries print
    steady = steady_figures(events)
    if steady:
        if f.get("steps_per_epoch"):  # the figure tables and compare show
            f["time_per_epoch_steady_s"] = steady["step_time_s"] * f["steps_per_epoch"]
        if f.get("tokens_per_sample"):
            steady["tokens_per_s"] = steady["samples_per_s"] * f["tokens_per_sample"]
        f["steady"] = SteadyFigures(**steady)
    if first_t is not None:
        f["total_s"] = last_t - first_t
    return RunSummary(per_epoch=tuple(per_epoch), notes=tuple(notes),
                      memory_check=tuple(MemoryCheck(**m) for m in memory_check(events)), **f)


def read_summary(run_dir: str | Path) -> RunSummary:
    """summary.json, or a summary rebuilt from the events when it is missing or unreadable;
    status "unreadable" (with the reason) when neither can be read."""
    path = Path(run_dir) / "summary.json"
    try:
        data = json.loads(safeio.read_text(path))
        if isinstance(data, dict):
            return RunSummary.from_dict(data)
    except (OSError, ValueError):
        pass
    try:
        return summarize(read_events(run_dir))
    except OSError as exc:
        return RunSummary.unreadable_record(
            f"events.jsonl cannot be read ({safeio.reason(exc)})")
    except Exception as exc:  # noqa: BLE001 - events of the right type but the wrong shapes
        return RunSummary.unreadable_record(
            f"the record cannot be summarised ({type(exc).__name__}: {exc})")


RECORD_FILES = ("events.jsonl", "summary.json", "config.toml", CHECKPOINT_NAME,
                "telemetry.jsonl")
# folders of the runs folder that hold no run: sweep manifests, and the records of a
# multi-node SLURM job's other nodes (core/slurm.py)
NOT_RUNS = ("sweeps", "nodes")


def is_run_folder(path: str | Path) -> bool:
    """A folder holding any file of a record, or one that cannot be looked into (it is listed,
    as unreadable, rather than hidden). Looks at names only: nothing is opened."""
    path = Path(path)
    try:
        if not path.is_dir():
            return False
        names = os.listdir(path)
    except OSError:
        return True
    return any(n in names for n in RECORD_FILES)


def run_folders(runs_dir: str | Path | None = None) -> list[Path]:
    """Every run folder under ``runs_dir`` (see :func:`is_run_folder`), newest first; [] when
    the folder does not exist; OSError when it cannot be listed."""
    base = Path(runs_dir) if runs_dir else default_runs_dir()
    try:
        entries = sorted(os.listdir(base), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [base / name for name in entries
            if not name.startswith(".") and name not in NOT_RUNS and is_run_folder(base / name)]


def list_runs(runs_dir: str | Path | None = None) -> list[tuple[Path, RunSummary]]:
    """Every run folder under ``runs_dir`` with its summary, newest first."""
    return [(p, read_summary(p)) for p in run_folders(runs_dir)]
