"""The app's five screens in fixed states, for the snapshot tests at several terminal sizes
(tests/tui/test_layout_snapshots.py): scripted records and events, fixed ids and times, paths
relative to the test's folder. Each ``open_*`` is a ``run_before`` for ``snap_compare``.
Nothing trains here: runs are records written in the real format, or scripted events."""

from __future__ import annotations

import sys
from pathlib import Path

from scripted import FakeHandle, fixed_inventory, run_events, wait_until
from textual.widgets import DataTable, Input

from gputui.core import runstore
from gputui.core.events import DeviceSample
from gputui.runs.sweep.runner import Manifest, Point, Sweep
from gputui.core.recorder import write_summary
from gputui.tui.app import make_app
from gputui.tui.messages import OpenCompare, SweepStarted
from gputui.tui.screens.compare import CompareScreen
from gputui.tui.screens.history import HistoryScreen
from gputui.tui.screens.run import RunScreen
from gputui.tui.screens.sweep import PointChanged, SweepScreen
from gputui.tui.widgets.run_log import RunLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from run_records import write_record  # noqa: E402

RUN_ID = "20240101-000000-quickstart"
RUNS = Path("runs")  # relative: the screens show it as it is, whatever the test's folder
SIZES = {"80x24": (80, 24), "100x30": (100, 30), "200x50": (200, 50)}
IDS = ["20260101-100000-exp-base", "20260101-110000-exp-two2", "20260101-120000-exp-four"]


def write_runs() -> None:
    """Three finished records in ./runs: one device, two and four."""
    write_record(RUNS, IDS[0], "single", 1, sps=1000, acc=0.91)
    write_record(RUNS, IDS[1], "scratch", 2, scale=True, sps=1800, acc=0.9, comm=0.2)
    write_record(RUNS, IDS[2], "ddp", 4, scale=True, sps=3000, acc=0.89, comm=0.3)


def make(presets: list[Path]):
    """The app as every scenario opens it (the quickstart preset, two GPUs listed)."""
    return make_app(preset="quickstart", runs_dir=RUNS, inventory=fixed_inventory(gpus=2),
                    presets=presets)


async def settle(pilot) -> None:
    """No clock in a snapshot: no blinking cursor, every log scrolled to its end."""
    await pilot.pause()
    pilot.app.clear_notifications()
    for box in pilot.app.screen.query(Input):
        box.cursor_blink = False
    for log in pilot.app.screen.query(RunLog):
        log.scroll_end(animate=False, immediate=True)
    await pilot.pause()


async def open_setup(pilot) -> None:
    # the estimate's sources (the history, the prediction's cache) are read off the UI thread
    await wait_until(pilot, lambda: pilot.app.screen.estimate_settled, what="the estimate")
    await settle(pilot)


async def open_run(pilot) -> None:
    app = pilot.app
    events = run_events(run_id=RUN_ID, epochs=3, steps_per_epoch=20, log_every=2)
    run_dir = RUNS / RUN_ID
    run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(run_dir, runstore.summarize(events))
    screen = RunScreen(FakeHandle([], run_id=RUN_ID, run_dir=run_dir))
    await app.push_screen(screen)
    await pilot.pause()
    screen.apply_events([e for e in events if not isinstance(e, DeviceSample)])
    for e in events:
        if isinstance(e, DeviceSample):
            screen.show_sample(e)
    await app.workers.wait_for_complete()  # the summary read (no pump runs here)
    await settle(pilot)


def measured(screen, kind: type) -> bool:
    """The screen of ``kind`` has its rows and its table has measured them. A DataTable
    sizes its columns to their cells, and its height to its rows, when its message queue is
    next idle, some time after the rows were added: a snapshot taken in between shows the
    empty table's column widths (one run in three did). The measure sets the table's virtual
    height to its header and rows, so that height says it has run."""
    if not isinstance(screen, kind) or not screen.loaded:
        return False
    table = screen.query_one(DataTable)
    return table.row_count > 0 and table.virtual_size.height == (
        table.header_height + sum(row.height for row in table.rows.values()))


async def open_history(pilot) -> None:
    write_runs()
    await pilot.press("f6")
    await wait_until(pilot, lambda: measured(pilot.app.screen, HistoryScreen),
                     what="the history table, measured")
    await settle(pilot)


async def open_compare(pilot) -> None:
    write_runs()
    pilot.app.post_message(OpenCompare([RUNS / i for i in IDS], RUNS, title="comparing 3 runs"))
    await wait_until(pilot, lambda: measured(pilot.app.screen, CompareScreen),
                     what="the comparison's table, measured")
    await settle(pilot)


async def open_sweep(pilot) -> None:
    """A sweep over 1, 2 and 4 CPU devices x single, scratch: some finished, one skipped,
    one running (its progress line), one pending."""
    app = pilot.app
    write_runs()
    await pilot.press("f7")
    await wait_until(pilot, lambda: isinstance(app.screen, SweepScreen), what="the sweep")
    screen = app.screen
    points = [Point(s, d, f"cpu*{d}" if d != "1" else "cpu") for d in ("1", "2", "4")
              for s in ("single", "scratch")]
    manifest = Manifest("20260101-130000-quickstart-ab12", "presets/quickstart.toml",
                        devices=["1", "2", "4"], strategies=["single", "scratch"],
                        created=0.0, points=points)
    sweep = Sweep.__new__(Sweep)  # the manifest alone: nothing is loaded or run here
    sweep.manifest, sweep.runs_dir = manifest, RUNS
    screen.post_message(SweepStarted(sweep))
    await pilot.pause()
    news = [(0, "finished", IDS[0], ""), (1, "skipped", "",
             "strategy 'scratch' needs at least 2 devices, the chosen devices (cpu) are 1"),
            (2, "skipped", "", "strategy 'single' uses 1 device, the chosen devices (cpu*2) "
             "are 2"), (3, "finished", IDS[1], ""),
            (5, "running", "20260101-140000-quickstart", "epoch 1/2 · step 12/46 · 2,950 "
             "samples/s")]
    for i, status, run_id, reason in news:
        p = points[i]
        p.status, p.run_id, p.reason = status, run_id, reason
        screen.post_message(PointChanged(p))
    await settle(pilot)


SCREENS = {"setup": open_setup, "run": open_run, "history": open_history,
           "compare": open_compare, "sweep": open_sweep}
