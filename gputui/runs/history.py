"""Run history: one row per recorded run, built from the run records, with filters.

Every row comes from ``runs/<id>/summary.json`` (rebuilt from events.jsonl when it is missing
or unreadable) and ``config.toml`` (or the config inside the RunStarted event). A record that
cannot be read at all still gets a row, with status "unreadable" and the reason, so one
damaged folder never hides the others. Torch-free: the CLI and the TUI import this.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from gputui.core import runstore, safeio
from gputui.core.events import RunStarted, Status
from gputui.core import machine
from gputui.runs.ids import find_run as find

# A record without a terminal event whose files have not changed for this long is not
# running any more: its writer died with its parent (e.g. a machine reset).
STALE_S = 120.0

COLUMNS = ("id", "name", "strategy", "devices", "batch", "lr", "time_per_epoch_s",
           "samples_per_s", "test_acc", "status", "date")


@dataclass
class RunRow:
    """What the run table shows about one run (plain values, JSON-ready)."""

    id: str
    name: str = ""
    strategy: str = ""
    devices: int | None = None  # number of devices (processes x devices for multi-node)
    device_names: list = field(default_factory=list)
    batch: int | None = None  # global batch after scale_with_devices
    lr: float | None = None  # learning rate after scale_with_devices
    time_per_epoch_s: float | None = None
    samples_per_s: float | None = None
    test_acc: float | None = None
    # a language model's score instead of test_acc (gputui.core.scores), and its tokens/s
    task: str = "classify"
    val_loss: float | None = None
    val_ppl: float | None = None
    tokens_per_s: float | None = None
    baseline_loss: float | None = None  # the unigram baseline its val_loss is read against
    status: str = "unknown"
    date: str = ""
    started: float = 0.0  # when it started, seconds since the epoch (started_at; 0: unknown)
    epochs_done: int = 0
    epochs: int | None = None
    init_s: float | None = None
    model: str = ""
    dataset: str = ""
    train_size: int | None = None
    context: int | None = None  # data.context: tokens per window (a language model's)
    precision: str = ""
    fast: str = ""  # the fast path it ran: precision, then compile mode and channels_last if set
    reason: str = ""
    problem: str = ""  # what in the record cannot be read ("" when all of it reads)
    run_dir: str = ""
    # speed figures from steady-state steps (gputui.core.steady); else whole epochs
    steady: bool = False
    noise: float | None = None  # relative 95 % half-width of the steady samples/s
    step_time_s: float | None = None  # steady mean step time
    resumed: bool = False  # run.resume_from was set: a continuation, not a whole run
    threads: int = 0  # intra-op threads per process (0: not recorded)
    cores: int = 0  # cores the run's processes could use (0: not recorded)
    # what else used the hardware while it ran (gputui.hw.contention; None: not recorded)
    machine: dict | None = None
    contended: bool = False
    no_speed: str = ""  # why the run has no speed figures ("" when it has)

    def to_dict(self) -> dict[str, Any]:
        """The row as a plain dict (every field)."""
        return asdict(self)


def read_config(run_dir: Path, events: list | None = None) -> dict[str, Any]:
    """config.toml as a dict, else the config of the RunStarted event, else {}."""
    try:
        return safeio.parse_toml(safeio.read_text(run_dir / "config.toml"))
    except (OSError, ValueError):
        pass
    try:
        events = events if events is not None else runstore.read_events(run_dir)
    except OSError:
        return {}
    for ev in events:
        if isinstance(ev, RunStarted):
            return ev.config.to_dict()
    return {}


def run_state(run_dir: Path) -> tuple[runstore.RunSummary, str]:
    """The run's summary and its status as a listing shows it: ``runstore.read_summary``, with a
    record that says "running" but has not moved for STALE_S (its writer is gone) shown as
    "incomplete" (and a reason saying so when the record has none)."""
    summary = runstore.read_summary(run_dir)
    if summary.status_text == Status.RUNNING.value and _stale(run_dir):
        reason = summary.reason or "the record ends without a final event"
        return replace(summary, reason=reason), "incomplete"
    return summary, summary.status_text


def _stale(run_dir: Path) -> bool:
    if (run_dir / "summary.json").exists():  # written only when the writer closed the record
        return True
    times = []
    for p in (run_dir / "events.jsonl", run_dir / "telemetry.jsonl"):
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            continue
    return not times or time.time() - max(times) > STALE_S


def problems(run_dir: Path) -> str:
    """What in a record cannot be read, one clause each ("" when every file reads): a file
    of the wrong kind, one without permission, or events.jsonl missing. Opens, reads nothing."""
    out = []
    try:
        names = set(os.listdir(run_dir))
    except OSError as exc:
        return f"the folder cannot be read ({safeio.reason(exc)})"
    if "events.jsonl" not in names:
        out.append("events.jsonl is missing")
    for name in sorted(names & set(runstore.RECORD_FILES)):
        try:
            os.close(safeio.open_regular(run_dir / name))
        except OSError as exc:
            out.append(exc_text(name, exc))
    return "; ".join(out)


def exc_text(name: str, exc: OSError) -> str:
    """"config.toml: Permission denied", or an Unreadable's own sentence (it names the file)."""
    return str(exc) if isinstance(exc, safeio.Unreadable) else f"{name}: {safeio.reason(exc)}"


def started_at(run_dir: Path, summary: runstore.RunSummary | None = None) -> float:
    """When the run started, seconds since the epoch (0.0: nothing says): the record's own
    RunStarted time (the summary's ``started_t``, else the first line of events.jsonl), else
    the time in its id, else when events.jsonl was last written. Never the folder's name
    alone: two runs of one second, or a folder named by hand, would sort by their names."""
    t = summary.started_t if summary else None
    if t is not None and t > 0:
        return float(t)
    try:
        for line in safeio.iter_lines(run_dir / "events.jsonl"):
            first = json.loads(line)
            if isinstance(first, dict) and isinstance(first.get("t"), (int, float)):
                return float(first["t"])
            break
    except (OSError, ValueError):
        pass
    try:
        return datetime.strptime(run_dir.name[:15], "%Y%m%d-%H%M%S").timestamp()
    except ValueError:
        pass
    try:
        return (run_dir / "events.jsonl").stat().st_mtime
    except OSError:
        return 0.0


def _date(started: float) -> str:
    return datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else ""


def row_for(run_dir: str | Path) -> RunRow:
    """The table row of one run folder; never raises for a damaged record."""
    run_dir = Path(run_dir)
    row = RunRow(id=run_dir.name, run_dir=str(run_dir))
    row.problem = problems(run_dir)
    if row.problem.startswith("the folder cannot be read"):
        row.status, row.reason = "unreadable", row.problem
        return row
    try:
        s, status = run_state(run_dir)
        cfg = read_config(run_dir)
    except Exception as exc:  # noqa: BLE001 - a damaged record must not break the listing
        row.status, row.reason = "unreadable", f"{type(exc).__name__}: {exc}"
        row.started = started_at(run_dir)
        row.date = _date(row.started)
        return row
    row.started = started_at(run_dir, s)
    row.date = _date(row.started)

    def sect(name: str) -> dict[str, Any]:
        table = cfg.get(name)
        return table if isinstance(table, dict) else {}

    run, optim, data = sect("run"), sect("optim"), sect("data")
    names = s.devices
    n = max(len(names), s.world_size) or None
    scale = n if (optim.get("scale_with_devices") and n) else 1
    row.name = str(run.get("name", ""))
    row.strategy = s.strategy or str(sect("strategy").get("name", ""))
    row.devices, row.device_names = n, list(names)
    row.batch = optim["batch_size"] * scale if isinstance(optim.get("batch_size"), int) else None
    row.lr = optim["lr"] * scale if isinstance(optim.get("lr"), (int, float)) else None
    steady = s.steady
    row.time_per_epoch_s = s.time_per_epoch_s
    row.samples_per_s = s.samples_per_s
    if steady and row.samples_per_s is not None:  # speed only for runs that trained epochs
        row.steady, row.noise = True, steady.noise
        row.samples_per_s, row.step_time_s = steady.samples_per_s, steady.step_time_s
        if s.steps_per_epoch:
            row.time_per_epoch_s = steady.step_time_s * s.steps_per_epoch
    row.status, row.reason = status, s.reason
    if row.status != "finished":  # a part of a run is no speed figure: shown nowhere
        row.no_speed = row.status + (f": {row.reason}" if row.reason else "")
        row.samples_per_s = row.time_per_epoch_s = row.step_time_s = row.noise = None
        row.steady = False
    row.resumed = bool(run.get("resume_from"))
    row.threads, row.cores = s.threads, s.cores
    row.test_acc = s.test_acc
    row.task = s.task or "classify"
    if row.task == "lm":
        row.val_loss, row.val_ppl = s.val_loss, s.val_ppl
        row.baseline_loss = s.baseline_loss
        if row.samples_per_s is not None and s.tokens_per_sample:  # (none: none either)
            row.tokens_per_s = row.samples_per_s * s.tokens_per_sample
    row.machine = machine.read(run_dir)
    row.contended = bool(row.machine and row.machine.get("contended"))
    row.epochs_done, row.epochs = s.epochs_done, s.epochs
    row.init_s = s.init_s
    row.model = str(s.model or sect("model").get("factory") or sect("model").get("name", ""))
    row.dataset = str(s.dataset or data.get("name", ""))
    row.train_size = data.get("train_size")
    row.context = data.get("context")
    row.precision = str(run.get("precision", "fp32"))
    row.fast = fast_path_label(run)
    return row


def fast_path_label(run: dict) -> str:
    """"bf16 compile=default channels_last": what a run's [run] table chose for speed."""
    parts = [str(run.get("precision", "fp32"))]
    if run.get("compile", "off") != "off":
        parts.append(f"compile={run['compile']}")
    if run.get("channels_last"):
        parts.append("channels_last")
    return " ".join(parts)


def load_rows(runs_dir: str | Path | None = None) -> list[RunRow]:
    """Every run under ``runs_dir`` (default: $GPUTUI_RUNS_DIR or ./runs), newest first: by
    when each started (:func:`started_at`), the id breaking a tie."""
    rows = [row_for(p) for p in runstore.run_folders(runs_dir)]
    return sorted(rows, key=lambda r: (r.started, r.id), reverse=True)


def filter_rows(rows: list[RunRow], strategy: str | None = None, status: str | None = None,
                name: str | None = None, last: int | None = None) -> list[RunRow]:
    """Rows matching every given filter (strategy and status accept comma lists; name is a
    substring of the run name or id); ``last`` keeps the newest N of those."""
    def allowed(value: str, wanted: str | None) -> bool:
        return wanted is None or value in {w.strip() for w in wanted.split(",")}

    out = [r for r in rows if allowed(r.strategy, strategy) and allowed(r.status, status)
           and (name is None or name.lower() in r.name.lower() or name.lower() in r.id.lower())]
    return out[:last] if last is not None else out


def find_run(ref: str, runs_dir: str | Path | None = None) -> Path:
    """A run folder from a path, an id, or a unique part of an id (``gputui.runs.ids``);
    LookupError otherwise."""
    return find(ref, runs_dir)
