"""The app's texts in the app's terms (issue 26): a strategy's reason says what to choose in
the app, not which flag to pass; a finished run offers no Stop or Kill; Save as preset
defaults to the user's presets folder; focus coming back to a field never selects its text."""

from __future__ import annotations

from scripted import FakeHandle, run_events
from textual.widgets import Input

from gputui.core.config import load_preset
from gputui.tui.app import make_app
from gputui.tui.fmt import app_terms
from gputui.tui.screens.run import RunScreen
from gputui.tui.widgets.strategy_picker import StrategyPicker

SIZE = (140, 44)


def test_app_terms_names_the_panel_not_the_flag():
    assert app_terms("strategy 'single' uses 1 device, devices.spec 'cpu*2' gives 2; use "
                     "--devices cpu or another strategy") == (
        "strategy 'single' uses 1 device, the chosen devices (cpu*2) are 2; use 1 CPU device "
        "(Devices, F2) or another strategy")
    assert app_terms("e.g. --devices cpu*4 with tp_size 2") == (
        "e.g. 4 CPU devices (Devices, F2: the CPU count under the table) with TP group size 2")
    assert app_terms("needs dist.rdzv_endpoint = 'HOST:PORT' (--rdzv-endpoint)") == (
        "needs dist.rdzv_endpoint = 'HOST:PORT'")
    assert app_terms("no flag here") == "no flag here"


async def test_strategy_reasons_and_a_finished_runs_footer(inventory, presets):
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        reasons = app.screen.query_one(StrategyPicker).reasons
        assert reasons and not any("--" in why for why in reasons.values()), reasons
        assert "(Devices, F2)" in reasons["single"]
        screen = RunScreen(FakeHandle([]))
        await app.push_screen(screen)
        await pilot.pause()
        assert {"s", "k"} <= set(app.active_bindings)  # a live run: Stop and Kill offered
        screen.apply_events(run_events(end="finished"))
        await pilot.pause()
        assert screen.state == "finished"
        assert not {"s", "k"} & set(app.active_bindings)


async def test_save_as_preset_defaults_to_the_users_presets_folder(tmp_path, monkeypatch,
                                                                   inventory, presets):
    monkeypatch.chdir(tmp_path)  # ./presets does not exist yet
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen.query_one("#preset-path", Input).value == "presets/quickstart.toml"
        await pilot.press("enter")
        await pilot.pause()
    saved = tmp_path / "presets" / "quickstart.toml"
    assert saved.is_file() and load_preset(saved).strategy.name == "scratch"


async def test_focus_coming_back_to_a_field_keeps_its_text(inventory, presets):
    launcher_error = RuntimeError("cannot spawn")
    from scripted import ScriptedLauncher

    app = make_app(preset="quickstart", inventory=inventory, presets=presets,
                   launcher=ScriptedLauncher(error=launcher_error))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        lr = app.screen.query_one("#f-optim-lr", Input)
        lr.focus()
        await pilot.press("end", "ctrl+r")  # a Start that fails
        await pilot.pause(0.2)
        await pilot.press("tab", "shift+tab", "5")  # away and back, then a key
        await pilot.pause()
        assert lr.value == "0.15"
