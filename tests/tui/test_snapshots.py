"""Deterministic snapshots of the app's screens (pytest-textual-snapshot).

Every screen (set-up, run, history, compare, sweep) at 80x24, 100x30 and 200x50: the
panels give way rather than squash (tests/tui/screens_at.py builds each screen from fixed
records and scripted events: nothing trains, no timing decides what shows), and under 80x24
one message says so. Plus the set-up with a bad field.
Update after an intended change with: pytest tests/tui/test_snapshots.py --snapshot-update
(then look at the SVGs: tests/tui/__snapshots__/test_snapshots/).
"""

from __future__ import annotations

import pytest
from screens_at import SCREENS, SIZES, make

from gputui.tui.app import make_app
from scripted import fixed_inventory

SIZE = (140, 44)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen_at_size(snap_compare, presets, tmp_path, monkeypatch, screen, size):
    monkeypatch.chdir(tmp_path)  # the records go to ./runs, shown as "runs"
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))  # no kept peaks of others
    assert snap_compare(make(presets), terminal_size=SIZES[size], run_before=SCREENS[screen])


def test_under_the_smallest_size_one_message_shows(snap_compare, presets):
    assert snap_compare(make(presets), terminal_size=(70, 20), run_before=SCREENS["setup"])


def test_setup_screen_with_a_bad_field(snap_compare, presets):
    async def type_bad_lr(pilot):
        await pilot.click("#f-optim-lr")
        await pilot.press("ctrl+a", "ctrl+k", "minus", "1")
        pilot.app.screen.query_one("#f-optim-lr").cursor_blink = False  # no clock in a snapshot
        await pilot.pause()

    app = make_app(preset="quickstart", inventory=fixed_inventory(gpus=2), presets=presets)
    assert snap_compare(app, terminal_size=SIZE, run_before=type_bad_lr)
