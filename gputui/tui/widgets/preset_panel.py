"""Presets: a list to load from and a button to save the form as a preset file."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Button, OptionList
from textual.widgets.option_list import Option


def available_presets() -> list[Path]:
    """The presets `gputui run` knows by name (./presets, then the project's presets/)."""
    from gputui.core.presets import list_presets

    return [Path(p) for p in list_presets()]


class PresetPanel(Vertical):
    """Enter or a click on a preset loads it into the form; the button saves the form."""

    class Load(Message):
        """Load this preset file into the set-up screen."""

        def __init__(self, path: Path) -> None:
            super().__init__()
            self.path = path

    class SaveRequested(Message):
        """The user asked to save the form as a preset."""

    def __init__(self, presets: list[Path]) -> None:
        super().__init__(id="presets")
        self.border_title = "Presets"
        self.presets = list(presets)
        self.loaded: Path | None = None

    def compose(self) -> ComposeResult:
        yield OptionList(*self._options(), id="preset-list")
        yield Button("Save as preset…", id="save-preset", compact=True)

    def _options(self) -> list[Option]:
        if not self.presets:
            return [Option("(no presets found)", id="", disabled=True)]
        return [Option(("● " if p == self.loaded else "  ") + p.stem, id=str(p))
                for p in self.presets]

    def set_presets(self, presets: list[Path], loaded: Path | None = None) -> None:
        """Show a new list (after saving one), marking the loaded preset."""
        self.presets, self.loaded = list(presets), loaded or self.loaded
        ol = self.query_one("#preset-list", OptionList)
        highlighted = ol.highlighted
        ol.clear_options()
        ol.add_options(self._options())
        if highlighted is not None and highlighted < ol.option_count:
            ol.highlighted = highlighted

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Load the chosen preset."""
        event.stop()
        if event.option_id:
            self.post_message(self.Load(Path(event.option_id)))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """The save button."""
        if event.button.id == "save-preset":
            event.stop()
            self.post_message(self.SaveRequested())
