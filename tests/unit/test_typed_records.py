"""One fact, one writer, typed: a run's status is decided once from its terminal event and is
the same for the handle, the record's summary, the CLI's exit code and the app; the strings
records hold are unchanged, so old records read."""

from __future__ import annotations

import pytest

from gputui.core import runstore
from gputui.core.events import (RunFailed, RunFinished, RunStopped, Status, StepMetrics,
                                event_from_dict)


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
    assert runstore.summarize(events)["status"] == status
    # read back from its JSON line, the event gives the same status
    if end is not None:
        assert Status.of(event_from_dict(end.to_dict())) is got
