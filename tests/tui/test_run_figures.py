"""The run screen's figures mean what they say (issue 26): the progress bar, its step count
and the ETA are the whole run's, as headless shows them, with the epoch as text; the
utilization and memory history rows are on absolute scales (0-100 %, 0-the device's total)."""

from __future__ import annotations

from scripted import GIB, T0, FakeHandle, run_events
from textual.widgets import ProgressBar

from gputui.core.events import DeviceSample, StepMetrics
from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen
from gputui.tui.widgets.device_panel import DevicePanel
from gputui.tui.widgets.history_row import HistoryRow, history_text
from gputui.tui.widgets.run_log import RunLog

SIZE = (140, 44)


def test_history_rows_are_drawn_on_an_absolute_scale():
    assert history_text([0.7, 0.7, 0.7], 100.0, 3) == "▁▁▁"  # nearly idle: the lowest block
    assert history_text([100.0] * 4, 100.0, 4) == "████"  # saturated: full blocks
    assert history_text([50.0], 100.0, 3) == "  ▄"  # newest at the right
    assert history_text([1.0 * GIB], 8.0 * GIB, 1) == "▁"  # 1 of 8 GiB
    assert history_text([0.0, 25.0, 100.0, 60.0], 100.0, 2) == "█▅"  # the last ones that fit
    assert history_text([2.0, 4.0], None, 2) == "▄█"  # no total known: the largest shown


async def test_progress_and_eta_are_the_whole_runs(inventory, presets):
    events = run_events(epochs=3, steps_per_epoch=20, log_every=5)
    first_of_epoch_2 = next(i for i, e in enumerate(events)
                            if isinstance(e, StepMetrics) and e.epoch == 2)
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = RunScreen(FakeHandle([]))
        await app.push_screen(screen)
        await pilot.pause()
        screen.apply_events([e for e in events[:first_of_epoch_2 + 1]
                             if not isinstance(e, DeviceSample)])
        await pilot.pause()
        assert str(screen.query_one("#epoch-label").render()) == "epoch 2/3 · step 25/60"
        bar = screen.query_one("#epoch-progress", ProgressBar)
        assert (bar.total, bar.progress) == (60, 25)
        # 35 steps left at 0.1 s, and two evaluations of 0.4 s: 4.3 s
        assert str(screen.query_one("#eta-label").render()) == "ETA 0:04 (whole run)"
        log = "\n".join(screen.query_one(RunLog).plain)
        assert ("ready in 2.5 s (launch 0.0 s, import 1.5 s, data 0.5 s, model 0.2 s, "
                "other 0.3 s)") in log


async def test_device_history_rows_use_absolute_scales(inventory, presets):
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=(200, 50)) as pilot:  # every panel shows
        screen = RunScreen(FakeHandle([]))
        await app.push_screen(screen)
        await pilot.pause()
        for i, (util, rss) in enumerate([(0.7, GIB), (0.7, GIB), (100.0, 8 * GIB)]):
            screen.show_sample(DeviceSample(device="cpu:0", cpu_percent=util, rss=rss,
                                            mem_total=8 * GIB, pid=1, t=T0 + i))
        await pilot.pause()
        panel = screen.query_one(DevicePanel)
        util_row = str(panel.query_one(".util-spark", HistoryRow).render()).strip()
        mem_row = str(panel.query_one(".mem-spark", HistoryRow).render()).strip()
        assert util_row == "▁▁█" and mem_row == "▁▁█"


def test_the_start_up_line_adds_up_with_the_launch():
    from gputui.core.events import InitDone, init_parts, init_text

    ev = InitDone(seconds=13.4, import_s=0.04, data_s=2.3, model_s=0.0, launch_s=8.93)
    assert init_text(ev) == ("13.4 s (launch 8.9 s, import 0.0 s, data 2.3 s, model 0.0 s, "
                             "other 2.2 s)")
    assert round(sum(v for _, v in init_parts(ev)), 1) == 13.4
    compiled = InitDone(seconds=3.0, import_s=1.0, model_s=0.5, compile_s=1.2, launch_s=0.2)
    assert [n for n, _ in init_parts(compiled)] == ["launch", "import", "data", "model",
                                                    "compile", "other"]
    assert round(sum(v for _, v in init_parts(compiled, 2)), 2) == 3.0


async def screen_showing(app, pilot, events) -> RunScreen:
    """A run screen pushed on ``app`` that has been handed ``events`` (samples left out)."""
    screen = RunScreen(FakeHandle([]))
    await app.push_screen(screen)
    await pilot.pause()
    screen.apply_events([e for e in events if not isinstance(e, DeviceSample)])
    await pilot.pause()
    return screen


async def test_validation_loss_beside_training_loss_and_a_time_axis(inventory, presets):
    from dataclasses import replace

    from gputui.core.events import EpochEnd
    from gputui.tui.widgets.plots import LossPlot

    events = [replace(e, task="lm", val_loss=2.0 / e.epoch) if isinstance(e, EpochEnd) else e
              for e in run_events(epochs=2, steps_per_epoch=20, log_every=5)]
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await screen_showing(app, pilot, events)
        loss = screen.query_one(LossPlot)
        # one validation point per epoch, at the epoch's last step, beside the steps' loss
        assert [(x, y) for x, y, _ in loss.extra] == [(20.0, 2.0), (40.0, 1.0)]
        assert loss.extra_label == "validation" and loss.label == "train"
        steps = [e for e in events if isinstance(e, StepMetrics)]
        assert loss._xy([(x, y, t) for (x, y), t in zip(loss.points, loss.times)])[0] == (
            5.0, steps[0].loss)
        await pilot.press("t")  # the x axis: elapsed time since the run started
        await pilot.pause()
        assert loss.time_axis
        timed = loss._xy([(x, y, t) for (x, y), t in zip(loss.points, loss.times)])
        assert timed[0] == (steps[0].t - T0, steps[0].loss)
        await pilot.press("t")
        assert not loss.time_axis


async def test_a_classification_runs_test_loss_beside_its_training_loss(inventory, presets):
    from dataclasses import replace

    from gputui.core.events import EpochEnd
    from gputui.tui.widgets.plots import LossPlot

    events = [replace(e, test_loss=1.5 / e.epoch) if isinstance(e, EpochEnd) else e
              for e in run_events(epochs=2, steps_per_epoch=20, log_every=5)]
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await screen_showing(app, pilot, events)
        loss = screen.query_one(LossPlot)
        # one test-loss point per epoch, at the epoch's last step, in the legend as "test"
        assert [(x, y) for x, y, _ in loss.extra] == [(20.0, 1.5), (40.0, 0.75)]
        assert loss.extra_label == "test" and loss.label == "train"
        assert "test loss 0.7500" in "\n".join(screen.query_one(RunLog).plain)
