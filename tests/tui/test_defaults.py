"""The app's own default learns within its first minute (issue 26): it is the quickstart
preset's learning settings, one short real run of it is far above chance, and the material's
settings stay one choice away with the reason they learn slowly."""

from __future__ import annotations

import time

import pytest
from textual.widgets import Input, OptionList, Static

from gputui.core.config import load_preset
from gputui.core.events import init_parts
from gputui.core.presets import PACKAGE_PRESETS
from gputui.tui.app import make_app
from gputui.tui.defaults import app_default, builtin, learns_slowly

SIZE = (140, 44)


def test_the_app_default_is_quickstarts_learning_settings():
    quick, default = load_preset(PACKAGE_PRESETS / "quickstart.toml"), app_default()
    assert default.model == quick.model
    assert default.optim == quick.optim
    assert default.data == quick.data
    for key in ("epochs", "seed", "log_every", "precision"):
        assert getattr(default.run, key) == getattr(quick.run, key), key
    assert not learns_slowly(default) and not learns_slowly(quick)
    material = builtin("material")
    assert learns_slowly(material)  # N(0, 0.01), lr 0.1, no momentum: RunConfig's own
    assert (material.model.init, material.model.init_std, material.optim.momentum,
            material.optim.lr) == ("normal", 0.01, 0.0, 0.1)


async def test_the_app_opens_on_its_default_and_offers_the_material(inventory, presets):
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert screen.base == app_default()
        assert app.setup_config == app_default()
        note = screen.query_one("#slow-note", Static)
        assert not note.display
        screen.query_one("#preset-list", OptionList).focus()
        await pilot.press("end", "enter")  # the last choice: the material's settings
        await pilot.pause()
        assert screen.base == builtin("material")
        assert note.display and "chance" in str(note.render())
        assert screen.query_one("#f-optim-lr", Input).value == "0.1"
        assert screen.sub_title == "set-up · the material"


@pytest.mark.slow
def test_one_epoch_of_the_app_default_is_far_above_chance(tmp_path):
    """A real run (in this process) of the default's settings, cut to 1 of its 3 epochs:
    67.5 % here (chance is 10 %); the material's settings stay at 10.0 % for 2 epochs. Its
    start-up parts add up, the launch included."""
    from gputui.hw.discovery import resolve_devices
    from gputui.core.recorder import Recorder
    from gputui.train.worker import execute

    cfg = app_default().replace(run={"epochs": 1})
    recorder, events = Recorder(tmp_path), []

    def emit(ev):
        events.append(ev)
        recorder.emit(ev)

    # launched 2 s ago: the start-up line counts that as the launch (issue 26)
    status = execute(cfg, resolve_devices(cfg.devices.spec), "default", emit, tmp_path,
                     lambda: False, time.time() - 2.0)
    recorder.close()
    assert status == "finished"
    (init,) = [e for e in events if e.kind == "init_done"]
    assert 2.0 <= init.launch_s < init.seconds
    assert round(sum(v for _, v in init_parts(init, 2)), 2) == round(init.seconds, 2)
    (end,) = [e for e in events if e.kind == "epoch_end"]
    assert end.test_acc >= 0.4, f"test accuracy {end.test_acc:.1%} after one epoch"
