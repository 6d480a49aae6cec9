"""A whole journey with a REAL run: preset, shrink, start on two CPU virtual devices, watch
loss and samples/s appear, stop, and find the record marked stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted import click_visible, fixed_inventory, wait_until
from textual.widgets import Input

from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen
from gputui.tui.widgets.plots import LossPlot, ThroughputPlot
from gputui.tui.widgets.run_log import RunLog

pytestmark = pytest.mark.slow
SIZE = (140, 44)


async def type_into(pilot, selector: str, text: str) -> None:
    await click_visible(pilot, selector)
    await pilot.press("ctrl+a", "ctrl+k", *text)


async def test_real_run_from_preset_to_stopped_record(tmp_path, presets):
    runs = tmp_path / "runs"
    app = make_app(runs_dir=runs, inventory=fixed_inventory(), presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+o", "enter")  # the preset list has focus: load quickstart
        await pilot.pause()
        # Shrink it: a small data set, a log line every 2 steps, epochs enough to stop it.
        await type_into(pilot, "#f-data-train-size", "2000")
        await type_into(pilot, "#f-run-log-every", "2")
        await type_into(pilot, "#f-run-epochs", "20")
        await type_into(pilot, "#f-extra", "data.test_size=256")
        await pilot.pause()
        assert app.screen.query_one("#f-run-epochs", Input).value == "20"
        cfg = app.screen.result.config
        assert (cfg.devices.spec, cfg.strategy.name, cfg.data.train_size) == ("cpu*2", "scratch",
                                                                                2000)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30,
                         what="the run screen")
        screen = app.screen
        await wait_until(pilot, lambda: len(screen.query_one(LossPlot).points) >= 2,
                         timeout=120, what="loss points from the real run")
        meta = str(screen.query_one("#status-meta").render())
        assert "samples/s n/a" not in meta and "init n/a" not in meta
        assert screen.query_one(ThroughputPlot).last_y > 0
        assert screen.state == "running"
        assert sorted(p.device for p in screen.query(".device-panel")
                      if p.device.startswith("cpu:")) == ["cpu:0", "cpu:1"]
        await pilot.press("s")
        await wait_until(pilot, lambda: screen.ended, timeout=60, what="the run to stop")
        await wait_until(pilot, lambda: "status stopped" in
                         str(screen.query_one("#record-line").render()), timeout=10)
        assert screen.state == "stopped"
        assert any("run stopped" in line for line in screen.query_one(RunLog).plain)
        run_dir = Path(screen.handle.run_dir)
    assert run_dir.parent == runs
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert summary["devices"] == ["cpu:0", "cpu:1"] and summary["strategy"] == "scratch"
    assert summary["last_loss"] > 0
