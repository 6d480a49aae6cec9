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


BUILTIN = "builtin:"  # the option id of a built-in choice (gputui.tui.defaults.BUILTINS)


class PresetPanel(Vertical):
    """Enter or a click on a preset loads it into the form; the button saves the form. The
    app's built-in choices (its default, the material's settings) follow the files."""

    class Load(Message):
        """Load this preset file into the set-up screen."""

        def __init__(self, path: Path) -> None:
            super().__init__()
            self.path = path

    class LoadBuiltin(Message):
        """Load one of the app's built-in settings (``gputui.tui.defaults.builtin``)."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    class SaveRequested(Message):
        """The user asked to save the form as a preset."""

    def __init__(self, presets: list[Path], builtins: dict[str, str] | None = None) -> None:
        super().__init__(id="presets")
        self.border_title = "Presets"
        self.presets = list(presets)
        self.builtins = dict(builtins or {})  # name -> label
        self.loaded: Path | None = None

    def compose(self) -> ComposeResult:
        yield OptionList(*self._options(), id="preset-list")
        yield Button("Save as preset…", id="save-preset", compact=True)

    def _options(self) -> list[Option]:
        # after the files, so a preset keeps its place in the list whatever the app offers
        own = [Option(f"  {label}", id=BUILTIN + name) for name, label in self.builtins.items()]
        if not self.presets:
            return [Option("(no presets found)", id="", disabled=True)] + own
        return [Option(("● " if p == self.loaded else "  ") + p.stem, id=str(p))
                for p in self.presets] + own

    def set_presets(self, presets: list[Path], loaded: Path | None = None) -> None:
        """Show a new list (after saving one), marking the loaded preset (None: no file)."""
        self.presets, self.loaded = list(presets), loaded
        ol = self.query_one("#preset-list", OptionList)
        highlighted = ol.highlighted
        ol.clear_options()
        ol.add_options(self._options())
        if highlighted is not None and highlighted < ol.option_count:
            ol.highlighted = highlighted

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Load the chosen preset."""
        event.stop()
        if event.option_id and event.option_id.startswith(BUILTIN):
            self.post_message(self.LoadBuiltin(event.option_id.removeprefix(BUILTIN)))
        elif event.option_id:
            self.post_message(self.Load(Path(event.option_id)))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """The save button."""
        if event.button.id == "save-preset":
            event.stop()
            self.post_message(self.SaveRequested())
