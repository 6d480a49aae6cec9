"""One fact, one writer, typed: a run's status is decided once from its terminal event and is
the same for the handle, the record's summary, the CLI's exit code and the app; the config and
the memory rows cross the record as objects. The JSON records hold is unchanged, so old records
read."""

from __future__ import annotations

import pytest

from gputui.core import runstore
from gputui.core.events import (RunFailed, RunFinished, RunStarted, RunStopped, Status,
                                StepMetrics, event_from_dict)


@pytest.mark.parametrize("end,status,code", [
    (RunFinished(seconds=1.0), "finished", 0),
    (RunFailed(reason="diverged"), "failed", 1),
    (RunStopped(reason="stopped by SIGINT"), "stopped", 1),
    (RunStopped(reason="killed by user", killed=True), "killed", 1),
    (None, "running", 1),
    (StepMetrics(epoch=1, step=1, global_step=1, steps_per_epoch=1, loss=1.0,
                 samples_per_s=1.0, step_time_s=1.0, lr=0.1), "running", 1),
])
def test_a_runs_status_is_decided_once_from_its_last_event(end, status, code):
    got = Status.of(end)
    assert got is Status(status) and got == status and f"{got}" == status
    assert got.exit_code == code
    # the record's summary says the same, in the string records have always held
    events = [e for e in (end,) if e is not None]
    assert runstore.summarize(events).status is got
    assert runstore.summarize(events).to_dict()["status"] == status
    # read back from its JSON line, the event gives the same status
    if end is not None:
        assert Status.of(event_from_dict(end.to_dict())) is got


def test_run_started_carries_the_config_object_and_its_record_the_same_json():
    """The config crosses the record as its TOML-shaped dict (the JSON line unchanged) and
    is read back as the RunConfig; an older record's config that no longer checks keeps what
    does (a record is read, never refused)."""
    import json

    from gputui.core.config import RunConfig

    cfg = RunConfig().replace(run={"epochs": 3, "name": "typed"}, optim={"lr": 0.2})
    ev = RunStarted(run_id="r", config=cfg, devices=({"name": "cpu:0"},), strategy="single")
    line = json.loads(ev.to_json())
    assert line["config"] == cfg.to_dict()  # the record's form, as it always was
    back = event_from_dict(line)
    assert isinstance(back, RunStarted) and back.config == cfg and back == ev
    old = dict(line, config={"run": {"epochs": 2, "gone_key": 1}, "optim": {"lr": "fast"},
                             "removed_table": {"x": 1}})
    read = event_from_dict(old)
    assert isinstance(read, RunStarted)
    assert read.config.run.epochs == 2 and read.config.optim.lr == RunConfig().optim.lr
    assert runstore.summarize([read]).epochs == 2


def test_memory_rows_are_typed_and_their_record_the_same_json():
    import json

    from gputui.core.events import MemoryReport, MemoryRow

    cpu = {"device": "cpu:0", "params": 10, "grads": 10, "optim": 20, "activations": None}
    cuda = {"device": "cuda:0", "params": 10, "grads": 10, "optim": 20, "experts": 4,
            "activations": 5, "alloc": 60, "peak": 70, "reserved": 80}
    report = event_from_dict({"type": "memory", "t": 1.0, "epoch": 1, "per_device": [cpu, cuda]})
    assert isinstance(report, MemoryReport)
    assert report.per_device == (MemoryRow("cpu:0", 10, 10, 20),
                                 MemoryRow("cuda:0", 10, 10, 20, 4, 5, 60, 70, 80))
    assert json.loads(report.to_json())["per_device"] == [cpu, cuda]
    assert [r.predicted() for r in report.per_device] == [40, 45]
    assert MemoryRow("cpu:1", params=1).predicted() is None  # grads, optim not counted
