"""The run record: ``runs/<run-id>/{config.toml, events.jsonl, telemetry.jsonl, summary.json}``.

Names, reading and the summary. Events are appended one JSON line at a time as they happen
(by the one writer, ``gputui.core.recorder``), so a crash loses at most the step in flight.
The summary is a pure function of the events (``summarize``), so it can always be rebuilt from
a record whose writer died.
"""

from __future__ import annotations

import json
import os
import secrets
import time
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


def summarize(events: Iterable[Event]) -> dict[str, Any]:
    """The run's summary: status, timing, throughput, accuracy (a pure function of events)."""
    events = list(events)
    s: dict[str, Any] = {"status": "running", "reason": "", "epochs_done": 0, "epochs": None,
                         "per_epoch": []}
    first_t: float | None = None
    last_t = 0.0
    for ev in events:
        first_t = ev.t if first_t is None else first_t
        last_t = ev.t
        if isinstance(ev, RunStarted):
            s.update(run_id=ev.run_id, started_t=ev.t, strategy=ev.strategy,
                     world_size=ev.world_size, devices=[d["name"] for d in ev.devices],
                     notes=list(ev.notes),
                     epochs=ev.config.run.epochs, model=ev.config.model.label,
                     dataset=ev.config.data.label)
        elif isinstance(ev, InitDone):
            s.update(init_s=ev.seconds, params=ev.params, train_samples=ev.train_samples,
                     steps_per_epoch=ev.steps_per_epoch, threads=getattr(ev, "threads", 0),
                     cores=getattr(ev, "cores", 0), omp_wait=getattr(ev, "omp_wait", ""),
                     task=ev.task)
            if s["task"] == "lm":
                s.update(tokens_per_sample=ev.tokens_per_sample,
                         baseline_loss=ev.baseline_loss)
        elif isinstance(ev, EpochEnd):
            entry: dict[str, Any] = {"epoch": ev.epoch, "seconds": ev.seconds,
                                     "train_loss": ev.train_loss, "test_acc": ev.test_acc,
                                     "samples_per_s": ev.samples_per_s}
            if ev.task == "lm":  # no accuracy: a validation loss
                entry.update(test_acc=None, val_loss=ev.val_loss, tokens_per_s=ev.tokens_per_s)
            elif ev.test_loss is not None:
                entry["test_loss"] = ev.test_loss
            s["per_epoch"].append(entry)
            s["epochs_done"] = ev.epoch
        elif isinstance(ev, StepMetrics):
            s["last_loss"] = ev.loss
        elif isinstance(ev, LogLine) and ev.level in ("info", "warning"):
            s.setdefault("notes", []).append(ev.message)
        elif is_terminal(ev):
            s["status"] = Status.of(ev).value
            if isinstance(ev, (RunFailed, RunStopped)):
                s["reason"] = ev.reason
    epochs = s["per_epoch"]
    if epochs:
        s["time_per_epoch_s"] = sum(e["seconds"] for e in epochs) / len(epochs)
        s["samples_per_s"] = sum(e["samples_per_s"] for e in epochs) / len(epochs)
        s["train_loss"] = epochs[-1]["train_loss"]
        if s.get("task") == "lm":
            s["test_acc"] = s["best_test_acc"] = None
            s["val_loss"] = epochs[-1]["val_loss"]
            s["best_val_loss"] = min(e["val_loss"] for e in epochs)
            s["val_ppl"] = perplexity(s["val_loss"])
            s["tokens_per_s"] = s["samples_per_s"] * (s.get("tokens_per_sample") or 0)
        else:
            s["test_acc"] = epochs[-1]["test_acc"]
            s["best_test_acc"] = max(e["test_acc"] for e in epochs)
    # the steady state (warm-up excluded, gputui.core.steady): what tables and summaries print
    s["steady"] = steady_figures(events)
    if s["steady"] and s.get("steps_per_epoch"):  # the figure tables and compare show
        s["time_per_epoch_steady_s"] = s["steady"]["step_time_s"] * s["steps_per_epoch"]
    if s["steady"] and s.get("tokens_per_sample"):
        s["steady"]["tokens_per_s"] = s["steady"]["samples_per_s"] * s["tokens_per_sample"]
    if first_t is not None:
        s["total_s"] = last_t - first_t
    s["memory_check"] = memory_check(events)  # [] off CUDA: no allocator peak
    return s


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """summary.json, or a summary rebuilt from the events when it is missing or unreadable;
    status "unreadable" (with the reason) when neither can be read."""
    path = Path(run_dir) / "summary.json"
    try:
        data = json.loads(safeio.read_text(path))
        if isinstance(data, dict):
            return data
    except (OSError, ValueError):
        pass
    try:
        return summarize(read_events(run_dir))
    except OSError as exc:
        return {"status": "unreadable", "epochs_done": 0, "epochs": None, "per_epoch": [],
                "reason": f"events.jsonl cannot be read ({safeio.reason(exc)})"}
    except Exception as exc:  # noqa: BLE001 - events of the right type but the wrong shapes
        return {"status": "unreadable", "epochs_done": 0, "epochs": None, "per_epoch": [],
                "reason": f"the record cannot be summarised ({type(exc).__name__}: {exc})"}


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


def list_runs(runs_dir: str | Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every run folder under ``runs_dir`` with its summary, newest first."""
    return [(p, read_summary(p)) for p in run_folders(runs_dir)]
