"""The run summary is a frozen RunSummary; its summary.json is byte for byte the one the dict
it replaced gave (the reference below is that code, verbatim), and old records read back as the
same object."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

import pytest

from gputui.core import runstore
from gputui.core.config import RunConfig
from gputui.core.events import (EpochEnd, Event, InitDone, LogLine, MemoryReport, MemoryRow,
                                RunFailed, RunFinished, RunStarted, RunStopped, Status,
                                StepMetrics, is_terminal)
from gputui.core.memcheck import memory_check
from gputui.core.recorder import write_summary
from gputui.core.runstore import RunSummary, summarize
from gputui.core.scores import perplexity
from gputui.core.steady import steady_figures


def _old_summarize(events: Iterable[Event]) -> dict[str, Any]:
    """summarize as it was when it built a dict (the commit before RunSummary), verbatim."""
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



def _steps(epoch: int, per_epoch: int = 20, windows: int = 4, sps: float = 100.0) -> list[Event]:
    out: list[Event] = []
    for w in range(1, windows + 1):
        step = per_epoch * w // windows
        out.append(StepMetrics(epoch=epoch, step=step, global_step=(epoch - 1) * per_epoch + step,
                               steps_per_epoch=per_epoch, loss=2.0 / epoch + w / 10,
                               samples_per_s=sps + w, step_time_s=0.25 + w / 100, lr=0.1,
                               t=float(epoch * 10 + w)))
    return out


def _started(epochs: int = 2, notes: tuple = ()) -> RunStarted:
    cfg = RunConfig().replace(run={"name": "sum", "epochs": epochs})
    return RunStarted(run_id="r1", config=cfg, devices=({"name": "cpu:0"}, {"name": "cpu:1"}),
                      strategy="ddp", world_size=2, notes=notes, t=1.0)


def _finished() -> list[Event]:
    """A classifier: epochs with and without a test loss, notes, a memory check."""
    rows = (MemoryRow(device="cuda:0", params=100, grads=100, optim=200, activations=50,
                      peak=600),)
    return [_started(notes=("a note",)), InitDone(seconds=2.5, params=100, train_samples=640,
                                                  steps_per_epoch=20, threads=2, cores=2,
                                                  omp_wait="passive", t=2.0),
            *_steps(1), EpochEnd(epoch=1, epochs=2, seconds=6.4, train_loss=2.0, test_acc=0.5,
                                 samples_per_s=100.0, t=15.0),
            LogLine(level="warning", message="slow data", t=16.0),
            MemoryReport(epoch=1, per_device=rows),
            *_steps(2), EpochEnd(epoch=2, epochs=2, seconds=6, train_loss=1.0, test_acc=0.75,
                                 samples_per_s=101.0, test_loss=0.7, t=25.0),
            RunFinished(seconds=24.0, t=26.0)]


def _failed_lm() -> list[Event]:
    """A language model that failed in its second epoch."""
    return [_started(epochs=3), InitDone(seconds=1.5, params=64, train_samples=320,
                                         steps_per_epoch=20, task="lm", tokens_per_sample=32,
                                         baseline_loss=4.5, t=2.0),
            *_steps(1), EpochEnd(epoch=1, epochs=3, seconds=3.2, train_loss=4.0,
                                 test_acc=math.nan, samples_per_s=100.0, task="lm",
                                 val_loss=3.9, tokens_per_s=3200.0, t=15.0),
            *_steps(2, windows=2), RunFailed(reason="diverged", t=22.0)]


def _stopped() -> list[Event]:
    """Stopped before its first epoch ended; a line logged before the run started."""
    return [LogLine(level="info", message="early", t=0.5), _started(), *_steps(1, windows=1),
            RunStopped(reason="stopped by SIGINT", t=12.0)]


RECORDS = {"finished": _finished, "failed": _failed_lm, "stopped": _stopped,
           "killed": lambda: [_started(), RunStopped(reason="killed", killed=True, t=3.0)],
           "no RunStarted": lambda: [LogLine(level="warning", message="x", t=1.0),
                                     *_steps(1)],
           "empty": lambda: []}


@pytest.mark.parametrize("name", list(RECORDS))
def test_summary_json_is_byte_for_byte_the_dicts_and_reads_back_as_the_same_object(
        name, tmp_path):
    events = RECORDS[name]()
    summary = summarize(events)
    assert isinstance(summary, RunSummary)
    old = _old_summarize(events)
    write_summary(tmp_path, summary)
    assert (tmp_path / "summary.json").read_text() == \
        json.dumps(old, indent=2, sort_keys=True) + "\n"
    # an old summary.json (written from the dict) reads back as the same object
    (tmp_path / "summary.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    back = runstore.read_summary(tmp_path)
    assert back == summary and back.to_dict() == summary.to_dict()


def test_the_typed_fields():
    s = summarize(_finished())
    assert s.status is Status.FINISHED and s.status_text == "finished" and not s.unreadable
    assert s.devices == ("cpu:0", "cpu:1") and s.notes == ("a note", "slow data")
    assert [e.test_loss for e in s.per_epoch] == [None, 0.7] and s.best_test_acc == 0.75
    assert s.steady is not None and s.steady.steps > 0 and s.steady.tokens_per_s is None
    assert s.memory_check[0].diff == 150 and s.total_s == 25.0
    lm = summarize(_failed_lm())
    assert lm.status is Status.FAILED and lm.reason == "diverged" and lm.lm
    assert lm.test_acc is None and lm.val_loss == 3.9 and lm.val_ppl == perplexity(3.9)
    assert lm.steady is not None and lm.steady.tokens_per_s == lm.steady.samples_per_s * 32
    with pytest.raises(AttributeError):  # frozen
        s.status = Status.FAILED  # type: ignore[misc]


def test_an_old_or_damaged_record_reads_with_defaults_and_ignores_unknown_keys():
    s = RunSummary.from_dict({"status": "finished", "epochs_done": 2, "from_the_future": 1,
                              "per_epoch": [{"epoch": 1, "seconds": 1.0, "train_loss": 1.0,
                                             "test_acc": 0.5, "samples_per_s": 9.0},
                                            "not an epoch"],
                              "steady": "garbage", "devices": ["cpu:0"], "epochs": math.inf,
                              "memory_check": 7, "cores": math.nan})
    assert s.status is Status.FINISHED and s.epochs_done == 2 and s.epochs is None
    assert len(s.per_epoch) == 1 and s.steady is None and s.run_id is None
    assert s.devices == ("cpu:0",) and s.threads == 0 and s.val_loss is None
    gone = RunSummary.from_dict({"status": "unreadable", "reason": "events.jsonl: gone"})
    assert gone.unreadable and gone.status_text == "unreadable"
    assert gone.to_dict() == {"status": "unreadable", "reason": "events.jsonl: gone",
                              "epochs_done": 0, "epochs": None, "per_epoch": []}


def test_a_resumed_runs_part_epoch_is_not_an_epochs_time():
    """A run resumed at step 30 of 32 ends its first epoch 2 steps later (0.26 s); the time an
    epoch takes is the whole ones' (3.91 s), not their mean with it (2.09 s, as a resumed
    record said). Without a whole epoch, the part ones are what there is."""
    started = RunStarted(run_id="r", config=RunConfig(), devices=(), strategy="single")
    init = InitDone(seconds=1.0, train_samples=1024, steps_per_epoch=32)

    def epoch(n: int, seconds: float, samples: int) -> EpochEnd:
        return EpochEnd(epoch=n, epochs=2, seconds=seconds, train_loss=1.0,
                        test_acc=0.5, samples_per_s=samples / seconds)

    got = summarize([started, init, epoch(1, 0.26, 64), epoch(2, 3.91, 1024)])
    assert got.time_per_epoch_s == pytest.approx(3.91)
    assert got.samples_per_s == pytest.approx(1024 / 3.91)
    assert len(got.per_epoch) == 2  # each epoch is still listed as it ran
    part = summarize([started, init, epoch(1, 0.26, 64)])
    assert part.time_per_epoch_s == pytest.approx(0.26)
