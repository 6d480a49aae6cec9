"""Modal dialogs: a choice between a few buttons, and the file name for "save as preset"."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Input, Label, Static
from textual.widgets.button import ButtonVariant

from gputui.core.filewrite import make_folder, write_atomic
from gputui.core.presets import user_presets_dir


class ChoiceDialog(ModalScreen[str | None]):
    """A question with buttons; dismisses with the pressed button's id (None on Escape)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, message: str,
                 choices: list[tuple[str, str, ButtonVariant]], *,
                 dialog_id: str = "choice") -> None:
        super().__init__(id=f"{dialog_id}-dialog")
        self.title_text = title
        self.message = message
        self.choices = choices  # (id, label, variant)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Static(self.message, classes="dialog-message", markup=False)
            with Horizontal(classes="dialog-buttons"):
                for cid, label, variant in self.choices:
                    yield Button(label, id=cid, variant=variant)

    def on_mount(self) -> None:
        self.query(Button).first().focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Answer with the button's id."""
        event.stop()
        self.dismiss(event.button.id)

    def action_cancel(self) -> None:
        """Escape: no answer."""
        self.dismiss(None)


class SavePresetDialog(ModalScreen[Path | None]):
    """Asks where to write the preset; refuses a bad name inside the dialog."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, default: Path) -> None:
        super().__init__(id="save-dialog")
        self.default = default
        self._confirm_overwrite: Path | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Save as preset", classes="dialog-title")
            yield Static("A TOML file that `gputui run FILE` accepts; saved in presets/ (made "
                         "if need be) it runs as `gputui run NAME`. Enter saves.",
                         classes="dialog-message")
            yield Input(str(self.default), id="preset-path")
            yield Static("", id="save-error", classes="field-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#preset-path", Input).focus()

    def _error(self, text: str) -> None:
        label = self.query_one("#save-error", Static)
        label.update(text)
        label.set_class(bool(text), "-shown")

    def _submit(self) -> None:
        raw = self.query_one("#preset-path", Input).value.strip()
        if not raw:
            self._error("give a file name, e.g. presets/mine.toml")
            return
        path = Path(raw).expanduser()
        # a new name gets .toml; a path that is there (a device, a pipe, a file by another
        # name) is written as given, as `-o` writes it: /dev/null is not /dev/null.toml
        if path.suffix != ".toml" and not (path.exists() or path.is_symlink()):
            path = path.with_suffix(path.suffix + ".toml" if path.suffix else ".toml")
        if not path.parent.exists() and path.parent != self.default.parent:
            self._error(f"the folder {path.parent} does not exist")
            return
        from gputui.core.filewrite import file_problem

        problem = file_problem(path, "preset")  # a folder, a device, no permission: say so here
        if problem:
            self._error(problem)
            return
        if path.is_file() and self._confirm_overwrite != path:
            self._confirm_overwrite = path
            self._error(f"{path} exists: press Save again to overwrite it")
            return
        self.dismiss(path)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the path box saves."""
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Save or Cancel."""
        event.stop()
        if event.button.id == "save":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        """Escape: do not save."""
        self.dismiss(None)


def save_preset(screen: Screen, stem: str, text: str,
                saved: Callable[[Path, str], None]) -> None:
    """Ask where to write the preset ``text`` (a free ``STEM.toml``, then ``STEM-2.toml``...,
    in the user's presets folder, never the project's own presets/), write it there, and call
    ``saved(path, name)`` with the name `gputui run` takes; a write that fails is one line."""
    folder = user_presets_dir()
    default = folder / f"{stem}.toml"
    n = 2
    while default.exists():
        default, n = folder / f"{stem}-{n}.toml", n + 1

    def write(path: Path | None) -> None:
        if path is None:
            return
        try:
            if path.parent == folder:
                make_folder(folder)
            write_atomic(path, text)
        except OSError as exc:  # WriteFailed: the file, the cause and the fix
            screen.notify(str(exc), severity="error", markup=False)
            return
        saved(path, path.stem if path.parent == folder else str(path))

    screen.app.push_screen(SavePresetDialog(default), write)
