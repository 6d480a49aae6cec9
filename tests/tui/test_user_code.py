"""A preset naming the user's code, in the app: the set-up screen marks it before Start, the
app process never imports it, and a real run of the example trains to the end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from scripted import ScriptedLauncher, fixed_inventory, wait_until

from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen
from textual.widgets import Static

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny.toml"
SIZE = (140, 44)


def marker(app) -> Static:
    return app.screen.query_one("#code-marker", Static)


def user_modules() -> list[str]:
    return [m for m in sys.modules if "tiny_model" in m or "tiny_data" in m]


async def test_the_setup_screen_marks_a_preset_that_runs_code(presets):
    app = make_app(preset=EXAMPLE, launcher=ScriptedLauncher(), inventory=fixed_inventory(),
                   presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = str(marker(app).render())
        assert shown == (f"⚠ runs your code: model.factory = {REPO / 'examples'}/tiny_model.py:"
                         f"build; data.factory = {REPO / 'examples'}/tiny_data.py:stripes")
        assert marker(app).display and not marker(app).has_class("-none")
        summary = str(app.screen.query_one("#summary").render())
        assert summary.startswith(f"Ready: single on cpu · {REPO / 'examples'}/tiny_model.py:build")
    assert user_modules() == []  # shown, not imported


async def test_no_marker_for_a_built_in_preset(presets):
    app = make_app(preset="quickstart", launcher=ScriptedLauncher(), inventory=fixed_inventory(),
                   presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not marker(app).display


@pytest.mark.slow
async def test_the_example_runs_in_the_app(tmp_path, presets):
    runs = tmp_path / "runs"
    app = make_app(preset=EXAMPLE, runs_dir=runs, inventory=fixed_inventory(), presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30,
                         what="the run screen")
        screen = app.screen
        await wait_until(pilot, lambda: screen.ended, timeout=120, what="the run to end")
        assert screen.state == "finished"
        run_dir = Path(screen.handle.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["epochs_done"] == 2
    assert summary["model"].endswith("tiny_model.py:build")
    assert user_modules() == []  # it ran in the training process only
