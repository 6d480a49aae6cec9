"""The training loop shared by every strategy: epochs, steps, metrics, evaluation.

The loop keeps the loss as a tensor and calls ``.item()`` only at the log interval and at the
end of an epoch (SYNC POINTs, marked below), so steps in between queue work without waiting.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from gputui.config import RunConfig
from gputui.events import EpochEnd, Event, StepMetrics
from gputui.training.data import Dataset, eval_batches
from gputui.training.strategies.base import Strategy

EVAL_BATCH = 1024


def train(cfg: RunConfig, strategy: Strategy, batches, ds: Dataset,
          emit: Callable[[Event], None], should_stop: Callable[[], bool]) -> str:
    """Run every epoch; returns "finished" or "stopped" (checked before each step)."""
    steps = batches.steps_per_epoch
    log_every = cfg.run.log_every
    batch = strategy.batch_size
    lr = strategy.lr
    global_step = 0
    for epoch in range(1, cfg.run.epochs + 1):
        strategy.set_train(True)
        t_epoch = window_start = time.perf_counter()
        epoch_loss = window_loss = None
        window_steps = 0
        for step, (x, y) in enumerate(batches.epoch(epoch), start=1):
            if should_stop():
                return "stopped"
            logged = step % log_every == 0 or step == steps
            strategy.meter = logged
            loss = strategy.train_step(x, y)
            window_loss = loss if window_loss is None else window_loss + loss
            epoch_loss = loss if epoch_loss is None else epoch_loss + loss
            window_steps += 1
            global_step += 1
            if logged:
                value = strategy.reduce_metric(window_loss).item()  # SYNC POINT (log interval)
                now = time.perf_counter()
                elapsed = max(now - window_start, 1e-9)
                timing = strategy.read_timing()
                emit(StepMetrics(
                    epoch=epoch, step=step, global_step=global_step, steps_per_epoch=steps,
                    loss=value / window_steps, samples_per_s=window_steps * batch / elapsed,
                    step_time_s=elapsed / window_steps, lr=lr,
                    comm_share=_comm_share(timing), per_device=_per_device(strategy, timing)))
                window_start, window_loss, window_steps = time.perf_counter(), None, 0
        # The last step of an epoch is always logged, so the device queue is drained here.
        epoch_s = time.perf_counter() - t_epoch
        train_loss = (strategy.reduce_metric(epoch_loss).item() / steps) if steps else float("nan")
        t_eval = time.perf_counter()
        acc = evaluate(strategy, ds)
        emit(EpochEnd(epoch=epoch, epochs=cfg.run.epochs, seconds=epoch_s,
                      train_loss=train_loss, test_acc=acc,
                      samples_per_s=steps * batch / max(epoch_s, 1e-9),
                      eval_s=time.perf_counter() - t_eval))
        if should_stop():
            return "stopped" if epoch < cfg.run.epochs else "finished"
    return "finished"


def evaluate(strategy: Strategy, ds: Dataset) -> float:
    """Test accuracy, with the test batches split across the strategy's devices."""
    strategy.set_train(False)
    device = strategy.data_device()
    correct = None
    for x, y in eval_batches(ds, EVAL_BATCH, device):
        c = strategy.evaluate(x, y)
        correct = c if correct is None else correct + c.to(correct.device)
    strategy.set_train(True)
    if correct is None:
        return float("nan")
    total = strategy.reduce_metric(torch.tensor(float(len(ds.test_x)), device=correct.device))
    return (strategy.reduce_metric(correct.double()) / total).item()  # SYNC POINT (epoch end)


def _comm_share(timing: dict) -> float | None:
    comm, step = timing.get("comm_s"), timing.get("step_s")
    if comm is None or not step:
        return None
    return min(1.0, comm / step)


def _per_device(strategy: Strategy, timing: dict) -> tuple:
    stats = {s["device"]: s for s in strategy.device_stats()}
    out = []
    for entry in timing.get("per_device", []):
        row = dict(stats.get(entry["device"], {}), **entry)
        if entry.get("compute_s"):
            row["samples_per_s"] = entry["samples"] / entry["compute_s"]
        out.append(row)
    return tuple(out)
