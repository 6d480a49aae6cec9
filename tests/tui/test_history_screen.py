"""The history screen and the compare view, driven through Pilot over recorded runs
(written in the real record format, one of them truncated)."""

from __future__ import annotations

import sys
from pathlib import Path

from scripted import wait_until
from textual.widgets import DataTable, Static

from gputui.tui.app import make_app
from gputui.tui.screens.compare import CompareScreen
from gputui.tui.screens.history import HistoryScreen
from gputui.tui.widgets.overlay_plot import OverlayPlot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from run_records import truncate_record, write_record  # noqa: E402

SIZE = (160, 44)


def make_runs(base: Path) -> Path:
    write_record(base, "20260101-100000-exp-base", "single", 1, batch=256, sps=1000, acc=0.91)
    write_record(base, "20260101-110000-exp-two2", "scratch", 2, batch=256, scale=True,
                 sps=1800, acc=0.9, comm=0.2)
    torn = write_record(base, "20260101-120000-exp-torn", "scratch", 2, sps=1500, epochs=3)
    truncate_record(torn, keep_lines=4)
    return base


async def open_history(pilot, app) -> HistoryScreen:
    await pilot.press("f6")
    await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen.loaded,
                     what="the history table")
    return app.screen


async def test_history_lists_runs_and_opens_one_with_plots(tmp_path, inventory, presets):
    runs = make_runs(tmp_path / "runs")
    app = make_app(runs_dir=runs, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, app)
        table = screen.query_one(DataTable)
        assert [str(k.value) for k in table.rows] == [
            "20260101-120000-exp-torn", "20260101-110000-exp-two2", "20260101-100000-exp-base"]
        first = [str(c) for c in table.get_row("20260101-110000-exp-two2")]
        assert "scratch" in first and "512" in first and "1,800" in first and "finished" in first
        assert "incomplete" in [str(c) for c in table.get_row("20260101-120000-exp-torn")]
        table.focus()
        await pilot.press("down", "enter")  # the 2-device run
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen) and
                         app.screen.loaded, what="the run view")
        view = app.screen
        (item,) = view.items
        assert item.row.id == "20260101-110000-exp-two2" and item.speedup == 1.8
        loss = view.query_one("#compare-loss", OverlayPlot)
        assert list(loss.series.values()) == [[(1.0, 2.0), (2.0, 1.0)]]
        row = [str(c) for c in view.query_one(DataTable).get_row("20260101-110000-exp-two2")]
        # scratch's two CPU virtual devices share one process: 1.8x is flagged, with why
        assert "flagged" in row and "FLAGGED" in row
        notes = str(view.query_one("#compare-notes", Static).render())
        assert "FLAGGED, speedup 1.80x" in notes and "one process" in notes
        assert "baseline 20260101-100000-exp-base (same batch per device)" in notes
        await pilot.press("escape")
        assert isinstance(app.screen, HistoryScreen)


async def test_mark_runs_and_compare_them(tmp_path, inventory, presets):
    runs = make_runs(tmp_path / "runs")
    app = make_app(runs_dir=runs, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, app)
        screen.query_one(DataTable).focus()
        await pilot.press("space", "down", "down", "space", "c")
        assert screen.marked == ["20260101-120000-exp-torn", "20260101-100000-exp-base"]
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen) and
                         app.screen.loaded, what="the comparison")
        view = app.screen
        assert [it.row.id for it in view.items] == screen.marked
        acc = view.query_one("#compare-acc", OverlayPlot)
        assert sorted(len(v) for v in acc.series.values()) == [1, 2]  # torn run: one epoch
        assert len(view.query_one(DataTable).rows) == 2


async def test_empty_history_says_so(tmp_path, inventory, presets):
    app = make_app(runs_dir=tmp_path / "none", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, app)
        assert "No runs recorded" in str(screen.query_one("#history-note", Static).render())
        await pilot.press("c", "enter")  # nothing to open: no crash, no new screen
        await pilot.pause()
        assert app.screen is screen


TINY = """
[run]
name = "tiny"
epochs = 1
log_every = 2
[model]
name = "lenet"
init = "default"
[data]
name = "synthetic"
train_size = 512
test_size = 128
[optim]
batch_size = 128
[devices]
spec = "cpu"
[telemetry]
enabled = false
"""


async def test_the_app_runs_a_sweep_and_compares_it(tmp_path, inventory):
    preset = tmp_path / "tiny.toml"
    preset.write_text(TINY)
    runs = tmp_path / "runs"
    app = make_app(preset=preset, runs_dir=runs, inventory=inventory, presets=[preset])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f7")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#sweep-devices").value = "1"
        screen.query_one("#sweep-strategies").value = "single,nosuch"
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: screen.state in ("finished", "failed", "interrupted"),
                         timeout=180, what="the sweep to end")
        assert screen.state == "finished"
        table = screen.query_one(DataTable)
        assert str(table.get_row("single@1")[2]) == "finished"
        assert str(table.get_row("nosuch@1")[2]) == "skipped"
        assert "'nosuch' is not available" in str(table.get_row("nosuch@1")[4])
        manifest = screen.sweep.manifest
        assert (runs / "sweeps" / f"{manifest.sweep_id}.json").exists()
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen) and
                         app.screen.loaded, what="the sweep's comparison")
        (item,) = app.screen.items
        # a run this short has no steady-state steps: no speedup, one note why (issue 24),
        # never "both from steady-state steps" beside "warm-up included"
        assert item.row.status == "finished" and item.speedup is None
        notes = str(app.screen.query_one("#compare-notes").render())
        assert "no steady-state steps" in notes and "both from steady-state" not in notes


async def test_history_names_a_damaged_record_and_what_does_not_read(tmp_path, inventory,
                                                                      presets):
    runs = make_runs(tmp_path / "runs")
    (runs / "20260101-120000-exp-torn" / "events.jsonl").unlink()  # as a crash of the disk may
    app = make_app(runs_dir=runs, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, app)
        note = str(screen.query_one("#history-note", Static).render())
        assert ("1 record read only in part: 20260101-120000-exp-torn: events.jsonl is missing"
                in note), note


async def test_history_shows_record_text_literally(tmp_path, inventory, presets):
    runs = tmp_path / "runs"
    odd = write_record(runs, "20260101-100000-q-aaaa", name="placeholder")
    for file in ("config.toml", "events.jsonl"):  # a name today's rules refuse, held by a record
        (odd / file).write_text((odd / file).read_text().replace("placeholder", "[/bold]q"))
    write_record(runs, "20260101-110000-[b]x[i]-bbbb", name="[red]y")
    app = make_app(runs_dir=runs, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, app)
        table = screen.query_one(DataTable)
        cells = [str(c) for k in table.rows for c in table.get_row(k)]
        assert "[/bold]q" in cells and "[red]y" in cells
        assert "20260101-110000-[b]x[i]-bbbb" in cells
        await pilot.pause()
        shown = app.export_screenshot()  # drawn, not only stored: markup raised while drawing
        assert "[/bold]q" in shown and "[b]x[i]" in shown
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen) and
                         app.screen.loaded, what="the run view")


async def test_the_compare_screen_shows_a_runs_scaling_waterfall(tmp_path, inventory, presets):
    from gputui.core.breakdown import make

    runs = tmp_path / "runs"
    one = make(span_s=0.1, data_s=0.0, compute_s=0.09, optimizer_s=0.01, comm_exposed_s=None)
    two = make(span_s=0.1, data_s=0.0, compute_s=0.06, optimizer_s=0.01, comm_exposed_s=0.03)
    write_record(runs, "20260101-100000-exp-base", "single", 1, batch=256, sps=1000,
                 windows=2, epochs=3, breakdowns=[one] * 3)
    run = write_record(runs, "20260101-110000-exp-ddp2", "ddp", 2, batch=256, scale=True,
                       sps=1500, windows=2, epochs=3, breakdowns=[two] * 3)
    app = make_app(runs_dir=runs, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(CompareScreen([run], runs))
        await wait_until(pilot, lambda: app.screen.loaded, what="the comparison")
        assert app.screen.query_one("#compare-waterfall").display
        text = str(app.screen.query_one("#compare-waterfall-text", Static).render())
        assert "scaling waterfall" in text and "exposed communication" in text
        assert "-0.60x" in text and "1.50x" in text
