"""Write run records in the real on-disk format (EventLog, summarize) for history/compare tests.

The figures are chosen by the test, so speedup and matching rules can be checked exactly;
real training runs are covered by test_sweep.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from gputui.core import runstore
from gputui.core.config import RunConfig
from gputui.core.events import (EpochEnd, InitDone, RunFailed, RunFinished, RunStarted,
                                RunStopped, StepMetrics)
from gputui.core.recorder import write_summary


def write_record(runs: Path, run_id: str, strategy: str = "single", n: int = 1,
                 batch: int = 256, lr: float = 0.1, sps: float = 1000.0, acc: float = 0.9,
                 epochs: int = 2, scale: bool = False, comm: float | None = None,
                 model: str = "lenet", status: str = "finished", train_size: int = 1000,
                 name: str = "exp", summary: bool = True,
                 breakdowns: list[dict] | None = None, windows: int = 1,
                 task: str = "classify") -> Path:
    """A complete record: config.toml, events.jsonl and (optionally) summary.json;
    ``breakdowns`` are the StepMetrics' step breakdowns, one per epoch; ``windows``: log
    windows per epoch (more than one steady window: a known noise, see core.steady); ``task``
    "lm": a language model's (64 tokens a sample, a validation loss an epoch)."""
    cfg = RunConfig().replace(run={"name": name, "epochs": epochs},
                              optim={"batch_size": batch, "lr": lr, "scale_with_devices": scale},
                              strategy={"name": strategy}, model={"name": model},
                              data={"train_size": train_size},
                              devices={"spec": "cpu" if n == 1 else f"cpu*{n}"})
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(cfg.to_toml(), encoding="utf-8")
    devices = tuple({"name": f"cpu:{i}", "kind": "cpu", "index": i, "label": ""}
                    for i in range(n))
    events = [RunStarted(run_id=run_id, config=cfg, devices=devices,
                         strategy=strategy, world_size=1, t=1.0),
              InitDone(seconds=2.5, params=100, train_samples=train_size, t=2.0, task=task,
                       tokens_per_sample=64 if task == "lm" else 0)]
    eff_batch = batch * (n if scale else 1)
    # one log window of 20 steps an epoch: the first is warm-up, the later ones are the
    # steady state (gputui.core.steady), so records of 2+ epochs have steady figures
    steps = 20
    for e in range(1, epochs + 1):
        for w in range(1, windows + 1):
            step = steps * w // windows
            events.append(StepMetrics(epoch=e, step=step, global_step=(e - 1) * steps + step,
                                      steps_per_epoch=steps, loss=2.0 / e, samples_per_s=sps,
                                      step_time_s=eff_batch / sps, lr=lr, comm_share=comm,
                                      breakdown=breakdowns[e - 1] if breakdowns else None,
                                      t=2.0 + e))
        lm = {"task": "lm", "val_loss": 2.0 / e, "tokens_per_s": sps * 64,
              "test_acc": float("nan")} if task == "lm" else {"test_acc": acc}
        events.append(EpochEnd(epoch=e, epochs=epochs, seconds=train_size / sps,
                               train_loss=2.0 / e, samples_per_s=sps, t=2.1 + e, **lm))
    events.append(RunFinished(seconds=3.0, t=10.0) if status == "finished"
                  else RunStopped(reason="stopped by user", t=10.0) if status == "stopped"
                  else RunFailed(reason="boom", t=10.0))
    # the events' wall-clock times start when the id says (history sorts and dates by them)
    t0 = _id_time(run_id)
    events = [dataclasses.replace(ev, t=ev.t + t0) for ev in events]
    log = runstore.EventLog(run_dir / "events.jsonl")
    for ev in events:
        log.write(ev)
    log.close()
    if summary:
        write_summary(run_dir, runstore.summarize(events))
    return run_dir


def _id_time(run_id: str) -> float:
    """Seconds since the epoch of a run id's YYYYMMDD-HHMMSS start, less 1 (the records' first
    event is at t = 1); 0.0 for an id without one."""
    from datetime import datetime

    try:
        return datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").timestamp() - 1.0
    except ValueError:
        return 0.0


def truncate_record(run_dir: Path, keep_lines: int, torn: str = '{"type":"step","ep',
                    age_s: float = 3600.0) -> None:
    """Cut events.jsonl after ``keep_lines`` lines, add a torn line, drop summary.json, and
    date the file ``age_s`` seconds back (a writer that died that long ago)."""
    path = run_dir / "events.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()[:keep_lines]
    path.write_text("\n".join(lines) + "\n" + torn, encoding="utf-8")
    (run_dir / "summary.json").unlink(missing_ok=True)
    then = time.time() - age_s
    os.utime(path, (then, then))
