"""How long a run will take, said before it starts: from this machine's earlier runs of the
same work (the run history), when the answer is more than a minute.

Pure Python (no Textual, no torch): the set-up screen reads the history off the UI thread and
asks :func:`estimate` on every change.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from gputui.core.config import RunConfig, effective_batch_size

WORTH_SAYING_S = 60.0  # shorter runs start without a word


@dataclass(frozen=True)
class Estimate:
    """The expected wall-clock time of a run and what it rests on."""

    seconds: float
    runs: int  # earlier runs of the same work it comes from

    def text(self) -> str:
        """'about 4 min on this machine (from 3 earlier runs)'."""
        return (f"about {duration_words(self.seconds)} on this machine "
                f"(from {self.runs} earlier run{'s' if self.runs != 1 else ''})")


def duration_words(seconds: float) -> str:
    """75 -> '1 min', 250 -> '4 min', 4800 -> '1 h 20 min'."""
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"


def same_work(row: Any, cfg: RunConfig, n_devices: int) -> bool:
    """A finished earlier run of the same model, data, size, strategy, devices, batch and
    precision, with a time per epoch."""
    model = cfg.model.factory or cfg.model.name
    return (row.status == "finished" and bool(row.time_per_epoch_s)
            and row.strategy == cfg.strategy.name and row.devices == n_devices
            and row.batch == effective_batch_size(cfg, n_devices)
            and row.model == model and row.dataset == (cfg.data.factory or cfg.data.name)
            and row.train_size == cfg.data.train_size
            and (row.precision or "fp32") == cfg.run.precision and not row.resumed)


def estimate(cfg: RunConfig, rows: Iterable[Any], n_devices: int) -> Estimate | None:
    """The run's expected time from the matching earlier runs (the median of their time per
    epoch times the epochs, plus their median start-up), or None without one, or when it is
    under a minute."""
    same = [r for r in rows if same_work(r, cfg, n_devices)]
    if not same:
        return None
    per_epoch = statistics.median(r.time_per_epoch_s for r in same)
    init = statistics.median(r.init_s or 0.0 for r in same)
    seconds = per_epoch * cfg.run.epochs + init
    return Estimate(seconds, len(same)) if seconds > WORTH_SAYING_S else None
