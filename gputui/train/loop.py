"""The training loop shared by every strategy: epochs, steps, metrics, evaluation, checkpoints.

The loop keeps each step's loss as a tensor and syncs only at the log interval and at the end
of an epoch (SYNC POINTs, marked below), so steps in between queue work without waiting. The
window's per-step losses are checked for NaN/inf there, so a diverged run is caught at its
first bad step without a per-step sync. Checkpoints (``gputui.train.checkpoint``) are
written at epoch ends, every ``run.checkpoint_every`` steps and on a stop; a run whose config
has ``run.resume_from`` starts from that checkpoint, skipping the batches already consumed
(the batch order is a function of (seed, epoch), so the rest of the epoch is the same).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from gputui.core import breakdown
from gputui.core.config import RunConfig
from gputui.core.events import DeviceStep, EpochEnd, Event, LogLine, StepMetrics, StepReport
from gputui.train import collectives
from gputui.train import checkpoint as ckpt, figures
from gputui.train.data import Dataset, eval_batches
from gputui.train.paramtrace import ParamTrace
from gputui.train.guards import (OOM_ERRORS, Diverged, diverged_message, first_bad,
                                    out_of_memory)
from gputui.train.strategies.base import Strategy

EVAL_BATCH = 1024


class _Window:
    """The steps since the last StepMetrics: their loss tensors and wall time."""

    def __init__(self, first_step: int):
        self.losses: list[torch.Tensor] = []
        self.first_step = first_step  # 1-based step (within the epoch) of losses[0]
        self.start = time.perf_counter()


def train(cfg: RunConfig, strategy: Strategy, batches, ds: Dataset,
          emit: Callable[[Event], None], should_stop: Callable[[], bool],
          run_dir: str | Path | None = None) -> str:
    """Run every epoch; returns "finished" or "stopped" (checked before each step). Raises
    Diverged, OutOfMemory or CheckpointError with a one-line message. With ``run_dir``,
    checkpoints go to ``run_dir/checkpoint.pt`` (written by each node's local rank 0), and
    under debug.trace_steps its first steps' losses and parameters to its param_trace.npz
    (``gputui.train.paramtrace``, whatever way the run ends)."""
    traces: list[ParamTrace] = []
    try:
        return _train(cfg, strategy, batches, ds, emit, should_stop, run_dir, traces)
    finally:
        if traces and run_dir is not None:
            traces[0].save(run_dir)


def _train(cfg: RunConfig, strategy: Strategy, batches, ds: Dataset,
           emit: Callable[[Event], None], should_stop: Callable[[], bool],
           run_dir: str | Path | None, traces: list[ParamTrace]) -> str:
    steps = batches.steps_per_epoch
    log_every, every = cfg.run.log_every, cfg.run.checkpoint_every
    saving = run_dir is not None and cfg.run.checkpoint
    path = Path(run_dir) / ckpt.CHECKPOINT_NAME if run_dir is not None else None
    warned = [False]
    cannot = ckpt.unsupported(strategy)
    if cannot and cfg.run.resume_from:
        raise ckpt.CheckpointError(cannot)
    if cannot and saving:
        saving = False
        emit(LogLine(level="warning", message=f"{cannot}; no checkpoint is written"))

    def save(position: ckpt.Position) -> None:
        if saving and path is not None:
            # every node keeps its own record, so each node's first rank writes its checkpoint
            ckpt.save(path, strategy, position, write=strategy.local_rank == 0)

    delay = cfg.debug.data_delay_s
    injected = [f"debug.{k} = {v:g} s" for k, v in (("comm_delay_s", cfg.debug.comm_delay_s),
                                                      ("data_delay_s", delay)) if v]
    if cfg.debug.slow_rank >= 0 and cfg.debug.slow_backward_ms:
        injected.append(f"debug.slow_backward_ms = {cfg.debug.slow_backward_ms:g} on rank "
                        f"{cfg.debug.slow_rank}")
    if injected:
        emit(LogLine(level="warning", message=f"{', '.join(injected)}: delays added on "
                                              f"purpose; speeds are not this machine's"))
    if cfg.debug.fault_strategy == strategy.name:
        emit(LogLine(level="warning", message=(
            f"debug.fault_strategy = {strategy.name!r}: this run's gradients are wrong on "
            f"purpose from global step {cfg.debug.fault_step} on")))

    first_epoch, skip, carried, global_step = 1, 0, 0.0, 0
    if cfg.run.resume_from:
        position = ckpt.restore(strategy, ckpt.load(cfg.run.resume_from))
        first_epoch, skip, carried = position.next_start()
        global_step = position.global_step
        emit(LogLine(level="info", message=(
            f"resumed from {cfg.run.resume_from}: epoch {position.epoch}, step {position.step} "
            f"done (global step {global_step})")))
    # the lr schedule spans the whole run and continues from the steps already taken
    strategy.updater.plan(cfg.run.epochs * steps,
                          strategy.updater.steps if cfg.run.resume_from else 0)
    trace = ParamTrace(strategy, cfg.debug.trace_steps) if cfg.debug.trace_steps else None
    if trace is not None:
        traces.append(trace)

    tokens = ds.image_size if strategy.task == "lm" else 0  # tokens per example (a window)
    flop_info = figures.flops_info(cfg, strategy, ds, emit)
    first = figures.FirstStep(cfg, strategy, emit, flop_info)
    for epoch in range(first_epoch, cfg.run.epochs + 1):
        first.new_epoch()
        done_before = skip if epoch == first_epoch else 0
        epoch_sum = carried if epoch == first_epoch else 0.0
        strategy.set_train(True)
        t_epoch = time.perf_counter()
        window = _Window(done_before + 1)

        def flush(epoch: int, step: int, global_step: int, timed: bool) -> None:
            """Emit the window's StepMetrics and fold its losses into the epoch's."""
            nonlocal window, epoch_sum
            if not window.losses:
                return
            # SYNC POINT (log interval): one transfer for the whole window, reduced over ranks
            # so every rank reaches the same divergence decision.
            per_step = strategy.reduce_metric(torch.stack(window.losses)).double().cpu()
            n = len(window.losses)
            bad = first_bad(per_step)
            if bad is not None:
                _diverged(cfg, emit, warned, global_step - n + bad + 1, epoch,
                          window.first_step + bad, per_step[bad].item())
            window_sum = per_step.sum().item()
            epoch_sum += window_sum
            elapsed = max(time.perf_counter() - window.start, 1e-9)
            report = strategy.step_report() if timed else None
            flops_s, mfu = figures.rate(flop_info, n, elapsed)
            rows = _per_device(strategy, report)
            samples_s = n * strategy.batch_size / elapsed
            emit(StepMetrics(
                epoch=epoch, step=step, global_step=global_step, steps_per_epoch=steps,
                loss=window_sum / n, samples_per_s=samples_s,
                tokens_per_s=samples_s * tokens if tokens else None,
                step_time_s=elapsed / n, lr=strategy.updater.last_lr(),
                comm_share=report.comm_share() if report else None, per_device=rows,
                breakdown=breakdown.mean(r.breakdown for r in rows),
                flops_per_s=flops_s, mfu=mfu, moe=strategy.moe_stats(),
                comm_gbps=breakdown.mean_value(r.comm_gbps for r in rows)))
            window = _Window(step + 1)

        step = done_before
        # The steps that are logged (and timed) or checkpointed are known before the epoch
        # starts; the step loop itself does only what a hand-written one does, plus two
        # comparisons and the stop check (an Event read, about 1 us). A timed step's batch
        # fetch is timed too (its data part of the step breakdown, gputui.core.breakdown).
        marks = _marks(done_before, steps, log_every, every, global_step)
        next_mark = marks.pop() if marks else 0
        source = iter(_delayed(batches.epoch(epoch, done_before), delay)
                      if delay else batches.epoch(epoch, done_before))
        while True:
            # the wait for a metered step's batch is its data time (perf_counter, no sync)
            fetch = time.perf_counter() if step + 1 == next_mark else 0.0
            batch = next(source, None)
            if batch is None:
                break
            x, y = batch
            if should_stop():
                # the window's steps since the last logged one: untimed
                flush(epoch, step, global_step, False)
                save(ckpt.Position(epoch, step, global_step, epoch_sum))
                return "stopped"
            step += 1
            collectives.at_step(global_step + 1)  # where a hang is named (core/hang.py)
            logged = step == next_mark
            # a logged step is metered: it gets the seconds its batch took to arrive
            data_s = time.perf_counter() - fetch if logged else None
            try:
                with first.context():
                    loss = strategy.train_step(x, y, data_s)
            except OOM_ERRORS as exc:
                raise out_of_memory(exc, strategy, x, y) from None
            first.after_step(epoch)
            window.losses.append(loss)
            if trace is not None and trace.after_step(loss):  # the steps traced: done
                flush(epoch, step, global_step, False)
                return "finished"
            global_step += 1
            if logged:
                flush(epoch, step, global_step, True)
                next_mark = marks.pop() if marks else 0
                if every > 0 and global_step % every == 0 and step < steps:
                    save(ckpt.Position(epoch, step, global_step, epoch_sum))
        # The last step of an epoch is always logged, so the device queue is drained here.
        epoch_s = time.perf_counter() - t_epoch
        train_loss = epoch_sum / steps if steps else float("nan")
        t_eval = time.perf_counter()
        score, test_loss = evaluate_with_loss(strategy, ds)
        first.report(epoch)  # a collective on every rank, like evaluate's
        samples_s = (steps - done_before) * strategy.batch_size / max(epoch_s, 1e-9)
        lm = strategy.task == "lm"
        emit(EpochEnd(epoch=epoch, epochs=cfg.run.epochs, seconds=epoch_s,
                      train_loss=train_loss, test_acc=float("nan") if lm else score,
                      samples_per_s=samples_s, eval_s=time.perf_counter() - t_eval,
                      task=strategy.task, val_loss=score if lm else None,
                      test_loss=None if lm else test_loss,
                      tokens_per_s=samples_s * tokens if lm else None))
        save(ckpt.Position(epoch, steps, global_step, epoch_sum, epoch_done=True))
        if should_stop():
            return "stopped" if epoch < cfg.run.epochs else "finished"
    return "finished"


def _delayed(batches, seconds: float):
    """The batches, each handed over ``seconds`` late (debug.data_delay_s: a slow data path
    on purpose, which the step breakdown shows as data)."""
    for batch in batches:
        time.sleep(seconds)
        yield batch


def _marks(done: int, steps: int, log_every: int, every: int, global_step: int) -> list[int]:
    """The steps after ``done`` that end a log window, latest first (for pop()): every
    ``log_every``-th, the epoch's last and every ``every``-th global step (a checkpoint)."""
    out = {s for s in range(done + 1, steps + 1) if s % log_every == 0}
    out.add(steps)
    if every > 0:
        first = global_step - done  # the global step before this epoch's step 1
        out.update(s for s in range(done + 1, steps + 1) if (first + s) % every == 0)
    return sorted(out, reverse=True)


def _diverged(cfg: RunConfig, emit, warned: list, global_step: int, epoch: int, step: int,
              value: float) -> None:
    """Stop the run (raise Diverged), or warn once when run.on_divergence = "continue"."""
    message = diverged_message(global_step, epoch, step, value)
    if cfg.run.on_divergence != "continue":
        raise Diverged(message)
    if not warned[0]:
        warned[0] = True
        emit(LogLine(level="warning", message=f"{message.split(';')[0]}; continuing "
                                              f"(run.on_divergence = \"continue\")"))


def evaluate(strategy: Strategy, ds: Dataset) -> float:
    """The test score, with the test batches split across the strategy's devices: accuracy,
    or for a language model the mean validation loss per token (``Strategy.score``)."""
    return evaluate_with_loss(strategy, ds)[0]


def evaluate_with_loss(strategy: Strategy, ds: Dataset) -> tuple[float, float]:
    """The test score (as :func:`evaluate`) and the mean loss over the test set (per example
    when classifying; for a language model the same validation loss per token)."""
    strategy.set_train(False)
    device = strategy.data_device()
    correct = None
    for x, y in eval_batches(ds, EVAL_BATCH, device):
        c = strategy.evaluate(x, y)
        correct = c if correct is None else correct + c.to(correct.device)
    strategy.set_train(True)
    if correct is None:
        return float("nan"), float("nan")
    total = strategy.reduce_metric(torch.tensor(float(ds.n_test), device=correct.device))
    score, loss = (strategy.reduce_metric(correct.double()) / total).tolist()  # SYNC POINT
    return score, loss


def _per_device(strategy: Strategy, report: StepReport | None) -> tuple[DeviceStep, ...]:
    """The report's rows with each device's allocator figures and its rate (samples over its
    compute)."""
    if report is None:
        return ()
    memory = strategy.device_memory()
    out = []
    for row in report.devices:
        row = row.with_memory(*memory.get(row.device, (None, None)))
        if row.compute_s:
            row = replace(row, samples_per_s=row.samples / row.compute_s)
        out.append(row)
    return tuple(out)
