"""The command palette's entries for the screen on top: its main actions, by name."""

from __future__ import annotations

from typing import Iterable

from textual.app import SystemCommand
from textual.screen import Screen


def screen_commands(screen: Screen) -> Iterable[SystemCommand]:
    """The set-up screen's Start, Save and presets; the run screen's Stop, Kill and Back."""
    from gputui.tui.screens.run import RunScreen
    from gputui.tui.screens.setup import SetupScreen

    if isinstance(screen, SetupScreen):
        yield SystemCommand("Start run", "Launch a run with this set-up (ctrl+r)",
                            screen.action_start)
        yield SystemCommand("Save as preset", "Write the form as a preset TOML file "
                            "(ctrl+s)", screen.action_save_preset)
        for path in screen.presets:
            yield SystemCommand(f"Load preset: {path.stem}", str(path),
                                lambda p=path: screen.load_preset(p))
    elif isinstance(screen, RunScreen):
        yield SystemCommand("Stop run", "Stop at the next step, keep the record (s)",
                            screen.action_stop)
        yield SystemCommand("Kill run", "End the training processes now (k)",
                            screen.action_kill)
        yield SystemCommand("Back to set-up", "Leave the run screen (escape)",
                            screen.action_back)
