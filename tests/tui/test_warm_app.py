"""The app's warm start with a REAL run: a training process loads torch while the set-up
screen is open, Start hands the run to it (no new process), and it waits for the next run."""

from __future__ import annotations

import pytest
from scripted import click_visible, fixed_inventory, wait_until
from textual.widgets import Input

from gputui.core.runstore import read_events
from gputui.runs import warm
from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen

pytestmark = pytest.mark.slow
SIZE = (140, 44)


async def test_start_runs_in_the_worker_prepared_on_the_set_up_screen(tmp_path, presets):
    warm.close_all()
    app = make_app(runs_dir=tmp_path / "runs", inventory=fixed_inventory(), presets=presets,
                   warm_start=True)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: warm.take() is not None, timeout=30,
                             what="a warm worker prepared on the set-up screen")
            worker = warm.take()
            assert worker.ready.wait(120)  # torch loaded while the user was choosing
            await pilot.press("ctrl+o", "enter")  # load quickstart, then shrink it
            await pilot.pause()
            for selector, text in (("#f-data-train-size", "1024"), ("#f-run-epochs", "1"),
                                   ("#f-extra", "data.test_size=256")):
                await click_visible(pilot, selector)
                await pilot.press("ctrl+a", "ctrl+k", *text)
            await pilot.pause()
            assert app.screen.query_one("#f-run-epochs", Input).value == "1"
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30,
                             what="the run screen")
            screen = app.screen
            await wait_until(pilot, lambda: screen.ended, timeout=120, what="the run's end")
            assert screen.state == "finished"
            assert screen.handle.host.process.pid == worker.process.pid  # no new process
            init = next(e for e in read_events(screen.handle.run_dir) if e.kind == "init_done")
            assert init.import_s < 0.5  # torch was already there
            await wait_until(pilot, lambda: warm.take() is worker, timeout=30,
                             what="the worker waiting for the next run")
    finally:
        warm.close_all()
    assert not worker.process.is_alive()
