"""History opens a run that is still running (started by another process, which holds its
folder's lock) on the run screen, live and read-only, followed from its record to its end:
here a hang named (a Stalled event) and the run's failure."""

from __future__ import annotations

import subprocess
import sys

from scripted import wait_until

from gputui.core.config import RunConfig
from gputui.core.events import RunFailed, RunStarted, Stalled, StepMetrics
from gputui.core.runstore import EventLog
from gputui.tui.app import make_app
from gputui.tui.screens.history import HistoryScreen
from gputui.tui.screens.run import RunScreen
from gputui.tui.widgets.run_log import RunLog

HOLDER = ("import sys, time\n"
          "from gputui.runs import runlock\n"
          "lock = runlock.hold(sys.argv[1], sys.argv[2])\n"
          "print('held', flush=True)\n"
          "time.sleep(600)\n")


def _step(n: int) -> StepMetrics:
    return StepMetrics(epoch=1, step=n, global_step=n, steps_per_epoch=10, loss=2.0 / n,
                       samples_per_s=100.0, step_time_s=0.1, lr=0.1)


async def test_history_follows_a_run_started_elsewhere_live_and_read_only(tmp_path, inventory,
                                                                          presets):
    run_id = "20261128-070000-elsewhere-abcd"
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), run_id],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        log = EventLog(run_dir / "events.jsonl")  # the other process's record, as it grows
        log.write(RunStarted(run_id=run_id, config=RunConfig().replace(run={"epochs": 1}),
                             devices=({"name": "cpu:0", "kind": "cpu", "label": ""},),
                             strategy="single"))
        log.write(_step(1))
        app = make_app(runs_dir=tmp_path / "runs", inventory=inventory, presets=presets)
        async with app.run_test(size=(160, 44)) as pilot:
            await pilot.press("f6")
            await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen)
                             and app.screen.loaded, what="the history table")
            assert app.screen.rows[run_id].status == "running"
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen)
                             and app.screen.events_handled >= 2, what="the followed run")
            screen = app.screen
            assert screen.read_only and screen.sub_title == f"watching · {run_id}"
            text = "\n".join(screen.query_one(RunLog).plain)
            assert f"started elsewhere (gputui pid {proc.pid})" in text and "read-only" in text
            # no Stop, no Kill: the run is another process's
            assert not screen.check_action("stop", ()) and not screen.check_action("kill", ())
            assert screen.state == "running"
            log.write(_step(2))
            hung = "rank 1 never entered all-reduce #9 of step 3; rank 0 waited 61 s"
            log.write(Stalled(message=hung, threshold_s=60.0, behind=(1,),
                              traces=("ranks/fr-trace-0.pkl",)))
            log.write(RunFailed(reason=f"hang: {hung}; stopped after 60 s without progress"))
            await wait_until(pilot, lambda: screen.state == "failed", what="the run's end")
            assert screen.events_handled == 5 and app.run_control is None
            text = "\n".join(screen.query_one(RunLog).plain)
            assert f"hang: {hung} (--stall-after 60 s)" in text
            assert "flight recorder: ranks/fr-trace-0.pkl" in text
            await pilot.press("escape")  # leaving a watched run asks nothing
            assert isinstance(app.screen, HistoryScreen)
        log.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)
