"""A run's energy, from each GPU's energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
read through :mod:`gputui.hw.nvml`), and the time and energy it took to reach a target.

The parent reads the counters of the run's GPUs when training begins (the ``InitDone`` event
arrives) and at each epoch's end (``EpochEnd``), so each epoch's joules cover its training
steps and its evaluation, not the set-up. At the run's end it records them in
``<run folder>/energy.json``: per epoch, the joules of every GPU and their sum. Readings a GPU
or driver cannot give are absent: a CPU run, or a GPU without the counter, records nothing.

Read back (:func:`figures`): joules per sample and per step (the epochs' joules over the
samples and steps they trained), and :func:`to_target`: the first epoch whose test accuracy
reaches a target (or whose validation loss falls to one), with the training seconds and the
joules spent until then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gputui.core.devices import Device
from gputui.core.events import EpochEnd, Event, InitDone
from gputui.core import runstore
from gputui.core.filewrite import write_atomic, WriteFailed
from gputui.core.safeio import read_text

FILE = "energy.json"


class EnergyMeter:
    """The parent's side: counters at training's start and at each epoch's end."""

    def __init__(self, devices: list[Device]):
        self.gpus = [d.name for d in devices if d.kind == "cuda"]
        self.start: dict[str, float] | None = None
        self.epochs: list[dict[str, Any]] = []
        self._handles: dict[str, Any] | None = None

    def _read(self) -> dict[str, float]:
        """Each GPU's counter now, in joules (the GPUs that have one)."""
        from gputui.hw import nvml

        if self._handles is None:
            order = nvml.order().devices if nvml.init() else []
            self._handles = {f"cuda:{i}": nvml.handle(g.uuid) for i, g in enumerate(order)}
        out = {}
        for name in self.gpus:
            h = self._handles.get(name)
            mj = nvml.energy_mj(h) if h is not None else None
            if mj is not None:
                out[name] = mj / 1000.0
        return out

    def seen(self, event: Event) -> None:
        """Read the counters at the events that bound training."""
        if not self.gpus:
            return
        if isinstance(event, InitDone):
            self.start = self._read()
        elif isinstance(event, EpochEnd) and self.start is not None:
            now = self._read()
            before = self.epochs[-1]["counters"] if self.epochs else self.start
            per = {d: now[d] - before[d] for d in now if d in before}
            if per:
                self.epochs.append({"epoch": event.epoch, "joules": sum(per.values()),
                                    "per_device": per, "counters": now})

    def write(self, run_dir: str | Path) -> None:
        """energy.json, when any epoch was measured (a full disk: the figures go, said
        nowhere else; the run's record is whole without them)."""
        if not self.epochs:
            return
        data = {"source": "nvmlDeviceGetTotalEnergyConsumption", "per_epoch": [
            {k: v for k, v in e.items() if k != "counters"} for e in self.epochs]}
        try:
            write_atomic(Path(run_dir) / FILE, json.dumps(data, indent=2) + "\n")
        except (OSError, WriteFailed):
            pass


def read(run_dir: str | Path) -> list[dict[str, Any]]:
    """The per-epoch energy a run recorded ([] where none was)."""
    try:
        data = json.loads(read_text(Path(run_dir) / FILE))
        return [e for e in data.get("per_epoch", []) if isinstance(e.get("joules"), (int, float))]
    except (OSError, ValueError, AttributeError):
        return []


def figures(summary: runstore.RunSummary,
            per_epoch: list[dict[str, Any]]) -> dict[str, Any]:
    """Joules in all, per sample and per step over the measured epochs (None without them)."""
    steps = summary.steps_per_epoch
    samples = summary.train_samples
    if not per_epoch:
        return {"energy_j": None, "j_per_sample": None, "j_per_step": None}
    total = sum(e["joules"] for e in per_epoch)
    n = len(per_epoch)
    return {"energy_j": total, "j_per_sample": total / (n * samples) if samples else None,
            "j_per_step": total / (n * steps) if steps else None}


def to_target(summary: runstore.RunSummary, per_epoch_energy: list[dict[str, Any]],
              acc: float | None = None, loss: float | None = None) -> dict[str, Any] | None:
    """The first epoch whose test accuracy is at least ``acc`` (a fraction) or whose
    validation loss is at most ``loss``, with the training seconds up to its end and the
    joules (None where not measured); None when no epoch reached it."""
    by_epoch = {e.get("epoch"): e["joules"] for e in per_epoch_energy}
    seconds = 0.0
    joules: float | None = 0.0
    for e in summary.per_epoch:
        seconds += e.seconds
        j = by_epoch.get(e.epoch)
        joules = None if joules is None or j is None else joules + j
        hit = (acc is not None and (e.test_acc or 0.0) >= acc) or \
            (loss is not None and e.val_loss is not None and e.val_loss <= loss)
        if hit:
            return {"epoch": e.epoch, "seconds": seconds, "joules": joules}
    return None


def run_figures(run_dir: str | Path, acc: float | None = None,
                loss: float | None = None) -> dict[str, Any]:
    """A recorded run's energy figures, its time and energy to the target (None where it did
    not reach it, or no target was given) and its memory check (summary.json)."""
    summary = runstore.read_summary(run_dir)
    per_epoch = read(run_dir)
    out = figures(summary, per_epoch)
    out["to_target"] = to_target(summary, per_epoch, acc, loss) \
        if acc is not None or loss is not None else None
    out["memory_check"] = [m.to_dict() for m in summary.memory_check]  # compare's rows
    return out
