"""The command palette offers the main actions, and running one from it works."""

from __future__ import annotations

from scripted import ScriptedLauncher, fixed_inventory, wait_until

from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen


def titles(app) -> list[str]:
    return [c.title for c in app.get_system_commands(app.screen)]


async def test_palette_starts_a_run_and_then_offers_stop_and_kill(presets):
    launcher = ScriptedLauncher()
    app = make_app(preset="quickstart", launcher=launcher, inventory=fixed_inventory(),
                   presets=presets)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        offered = titles(app)
        assert {"Start run", "Save as preset", "Load preset: quickstart"} <= set(offered)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Start run")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        assert launcher.configs[0].strategy.name == "scratch"
        assert {"Stop run", "Kill run", "Back to set-up"} <= set(titles(app))
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Stop run")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.screen.ended, what="the run to stop")
        assert launcher.handles[0].stop_calls == 1
