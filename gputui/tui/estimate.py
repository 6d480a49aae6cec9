"""How long a run will take, said before it starts, when the answer is more than a minute:
from this machine's earlier runs of the same work (the run history), else, for a first run,
from the prediction's kept measurements of this machine (``gputui predict`` keeps a step
time per model, data, batch, threads and device: :mod:`gputui.runs.predict.measure`), else
why there is none.

No Textual, no torch: the set-up screen reads the history off the UI thread and asks
:func:`estimate` on every change; :func:`predicted` reads the prediction's cache file, so the
screen asks it in a thread worker.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from gputui.core.config import RunConfig, effective_batch_size

WORTH_SAYING_S = 60.0  # shorter runs start without a word


@dataclass(frozen=True)
class Estimate:
    """The expected wall-clock time of a run and what it rests on."""

    seconds: float
    runs: int  # earlier runs of the same work it comes from (0: predicted)

    def text(self) -> str:
        """'about 4 min on this machine (from 3 earlier runs)', or for a prediction 'about
        4 min of training steps on this machine (predicted from its measured steps)'."""
        if not self.runs:
            return (f"about {duration_words(self.seconds)} of training steps on this machine "
                    f"(predicted from its measured steps)")
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


FIRST_RUN = "first run of this work here"  # and nothing measured of it: no estimate
HOW_TO_MEASURE = ("For a first run, `gputui predict PRESET` measures its steps on this "
                  "machine and keeps them: the estimate uses them.")


def train_examples(cfg: RunConfig) -> int | None:
    """The training examples of an epoch, as far as they are known before the data is read
    (None for text windows and a data factory's set: known only once loaded)."""
    from gputui.core import datafiles

    d = cfg.data
    if d.train_size:
        return d.train_size
    if d.factory:
        return None
    if d.name == "synthetic":
        return datafiles.SYNTHETIC_SIZES["train"]
    if d.name in datafiles.IDX_FOLDERS or d.name == "cifar10":
        base = datafiles.data_root(d.root)
        if d.source == "test-split":
            n = datafiles.split_size(d.name, base, "test")
            return int(0.8 * n) if n > 0 else None
        n = datafiles.split_size(d.name, base, "train")
        return n if n > 0 else None
    return None


UNKNOWN_GPU = "?"  # a GPU is chosen but the last discovery gave no name for it


def predicted(cfg: RunConfig, n_devices: int, gpu: str = "") -> Estimate | str:
    """The training steps' time (steps per epoch x epochs x the predicted step) from the
    prediction's kept measurements of this machine, measuring nothing; or why there is
    none, as a phrase. ``gpu``: the chosen GPUs' name ('' on CPU devices, UNKNOWN_GPU when
    the last discovery gave none). Reads the cache file: call it off the UI thread."""
    from gputui.runs.predict.scaling import STRATEGIES, predict
    from gputui.runs.predict.measure import Measurer

    if gpu == UNKNOWN_GPU:  # never a CPU's measured steps for a GPU run
        return FIRST_RUN
    strategy = cfg.strategy.name
    if n_devices > 1 and strategy not in STRATEGIES:
        return f"{FIRST_RUN} ({strategy} has no prediction)"
    examples = train_examples(cfg)
    if examples is None:
        return f"{FIRST_RUN} (its data's size is known once read)"
    measurer = Measurer(cfg, "gpu" if gpu else "cpu", Path("."), line=lambda _: None,
                        measure=False, gpu_name=gpu)
    n = max(1, n_devices)
    step = predict(strategy, measurer.inputs(n, [strategy])).step_time_s
    if not step:
        return FIRST_RUN
    steps = examples // max(1, effective_batch_size(cfg, n))
    return Estimate(step * steps * cfg.run.epochs, 0)
