"""Deterministic snapshots of the set-up and run screens (pytest-textual-snapshot).

Fixed inventory, the quickstart preset only, scripted events fed straight to the run screen
(no pump: the app pumps only the runs it launched, so no timing decides which samples are
coalesced), timestamps from the events.
Update after an intended change with: pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

from scripted import FakeHandle, fixed_inventory, run_events

from gputui.core import runstore
from gputui.core.events import DeviceSample
from gputui.train.recorder import write_summary
from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen

SIZE = (140, 44)
RUN_ID = "20240101-000000-quickstart"


def setup_app(presets):
    return make_app(preset="quickstart", inventory=fixed_inventory(gpus=2), presets=presets)


def test_setup_screen(snap_compare, presets):
    assert snap_compare(setup_app(presets), terminal_size=SIZE)


def test_setup_screen_with_a_bad_field(snap_compare, presets):
    async def type_bad_lr(pilot):
        await pilot.click("#f-optim-lr")
        await pilot.press("ctrl+a", "ctrl+k", "minus", "1")
        pilot.app.screen.query_one("#f-optim-lr").cursor_blink = False  # no clock in a snapshot
        await pilot.pause()

    assert snap_compare(setup_app(presets), terminal_size=SIZE, run_before=type_bad_lr)


def test_run_screen_after_a_finished_run(snap_compare, presets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    events = run_events(run_id=RUN_ID, epochs=3, steps_per_epoch=20, log_every=2)
    run_dir = Path("runs") / RUN_ID
    run_dir.mkdir(parents=True)
    write_summary(run_dir, runstore.summarize(events))
    app = make_app(inventory=fixed_inventory(), presets=presets)

    async def show_run(pilot):
        screen = RunScreen(FakeHandle([], run_id=RUN_ID, run_dir=run_dir))
        await app.push_screen(screen)
        await pilot.pause()
        screen.apply_events([e for e in events if not isinstance(e, DeviceSample)])
        for e in events:
            if isinstance(e, DeviceSample):
                screen.show_sample(e)
        await app.workers.wait_for_complete()  # the summary read (no pump runs here)
        await pilot.pause()
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=show_run)
