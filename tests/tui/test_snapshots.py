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


async def test_at_80x24_start_and_the_epoch_tables_time_stay_on_the_screen(presets, tmp_path,
                                                                           monkeypatch):
    """At the smallest size a preset naming code (its warning), a slow preset's note and a
    long summary pushed Start below the screen, and the epoch table cut its time column."""
    from pathlib import Path

    from screens_at import open_run

    from gputui.tui.widgets.epoch_table import EpochTable

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    repo = Path(__file__).resolve().parents[2]
    for preset in (repo / "examples" / "tiny.toml", repo / "presets" / "lenet-scratch-1dev.toml"):
        app = make_app(preset=preset, inventory=fixed_inventory(gpus=2), presets=presets)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            start = app.screen.query_one("#start")
            assert 0 < start.region.y and start.region.bottom <= 23, (preset, start.region)
            assert app.screen.get_widget_at(start.region.x + 2, start.region.y + 1)[0] is start
    async with make(presets).run_test(size=(80, 24)) as pilot:
        await open_run(pilot)
        table = pilot.app.screen.query_one(EpochTable)
        shown = table.scrollable_content_region.width
        widths = [c.get_render_width(table) for c in table.ordered_columns]
        upto_time = sum(widths[:table.labels.index("time") + 1])
        assert upto_time <= shown, (widths, shown)
