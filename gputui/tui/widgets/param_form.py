"""The hyperparameter form, validated as you type with the CLI's own messages."""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.validation import ValidationResult, Validator
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Label, Select, Static

from gputui.core.config import RunConfig
from gputui.tui.form import (FIELDS, FieldSpec, check_field, current_value, empty_meaning,
                             field_text, select_options)

EXTRA_ID = "f-extra"


class ConfigFieldValidator(Validator):
    """Validates one field by applying it to the config as ``--set`` would."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def validate(self, value: str) -> ValidationResult:
        message = check_field(self.key, value)
        return self.failure(message, value) if message else self.success()


def initial_value(config: RunConfig, spec: FieldSpec) -> Any:
    """What a field's editor holds for ``config``: an input's text, a checkbox's bool, a
    select's choice."""
    value = current_value(config, spec.key)
    if spec.kind == "switch":
        return bool(value)
    return field_text(spec.key, value) if spec.kind == "input" else value


class ParamForm(VerticalScroll):
    """One row per field: label, editor, and the error under it when there is one.

    ``lazy``: the rows are mounted after the screen's first paint (in a terminal: the form is
    most of the set-up screen's widgets, and styling them held its first paint back). Until
    they are (``ready``), the form answers from its config: ``values()`` is what the editors
    will show, and errors wait to be shown."""

    class Ready(Message):
        """The rows are mounted (a lazy form)."""

    def __init__(self, config: RunConfig, lazy: bool = False) -> None:
        super().__init__(id="params")
        self.border_title = "Hyperparameters"
        self.base = config
        self.lazy = lazy
        self.ready = not lazy  # the rows are mounted
        self.shown: dict[str, str] = {}  # dom id -> the message under that field
        self._waiting_errors: tuple[dict[str, str], str] | None = None

    def compose(self) -> ComposeResult:
        if not self.lazy:
            yield from self._rows()

    def on_mount(self) -> None:
        if self.lazy:
            self.call_after_refresh(self._mount_rows)

    async def _mount_rows(self) -> None:
        base = self.base
        await self.mount_all(self._rows())
        self.ready = True
        if self.base is not base:  # a preset loaded while the rows were mounting
            self.load(self.base)
        if self._waiting_errors is not None:
            self.show_errors(*self._waiting_errors)
        self.post_message(self.Ready())

    def _rows(self) -> list[Widget]:
        rows: list[Widget] = [
            Horizontal(Label("" if spec.kind == "switch" else spec.label, classes="field-label"),
                       self._editor(spec), classes="field-row") for spec in FIELDS]
        rows.append(Horizontal(
            Label("More --set", classes="field-label"),
            Input(placeholder="e.g. data.test_size=500", id=EXTRA_ID, compact=True,
                  select_on_focus=False,
                  tooltip="Any other setting, written as for `gputui run --set`."),
            classes="field-row"))
        rows.append(Static("", id="field-help", markup=False))
        return rows

    def _editor(self, spec: FieldSpec) -> Widget:
        value = initial_value(self.base, spec)
        if spec.kind == "select":
            options, disabled = select_options(self.base, spec)
            return Select(options, value=value, allow_blank=False, disabled=disabled,
                          id=spec.dom_id, compact=True, tooltip=spec.help())
        if spec.kind == "switch":
            return Checkbox(spec.label, value=value, id=spec.dom_id, compact=True,
                            tooltip=spec.help())
        return Input(value, placeholder=empty_meaning(spec.key),
                     # focus coming back (a dialog, a toast, a screen closing) must not
                     # select the text: the next key would replace the whole value
                     id=spec.dom_id, compact=True, tooltip=spec.help(), select_on_focus=False,
                     validators=[ConfigFieldValidator(spec.key)],
                     validate_on=["changed", "submitted"])

    # ------------------------------------------------------------------ values
    def _mounted_editor(self, spec: FieldSpec) -> Input | Select | Checkbox:
        """The field's editor, of the kind _editor made."""
        if spec.kind == "select":
            return self.query_one(f"#{spec.dom_id}", Select)
        if spec.kind == "switch":
            return self.query_one(f"#{spec.dom_id}", Checkbox)
        return self.query_one(f"#{spec.dom_id}", Input)

    def values(self) -> dict[str, Any]:
        """Raw values by config key: input text, a select's choice, a checkbox's bool."""
        if not self.ready:  # what the editors will hold
            return {spec.key: initial_value(self.base, spec) for spec in FIELDS}
        out: dict[str, Any] = {}
        for spec in FIELDS:
            out[spec.key] = self._mounted_editor(spec).value
        return out

    def extra(self) -> str:
        """The 'More --set' text: overrides as table.key=value, space separated."""
        return self.query_one(f"#{EXTRA_ID}", Input).value if self.ready else ""

    def load(self, config: RunConfig) -> None:
        """Show a config's values (after loading a preset)."""
        self.base = config
        if not self.ready:  # the rows will be made from it
            return
        for spec in FIELDS:
            editor = self._mounted_editor(spec)
            if isinstance(editor, Select):
                options, editor.disabled = select_options(config, spec)
                editor.set_options(options)
            editor.value = initial_value(config, spec)
        self.query_one(f"#{EXTRA_ID}", Input).value = ""

    def show_errors(self, errors: dict[str, str], extra_error: str = "") -> None:
        """Put each message under its field; clear the others."""
        if not self.ready:
            self._waiting_errors = (errors, extra_error)
            return
        for spec in FIELDS:
            self._show(spec.dom_id, errors.get(spec.key, ""))
        self._show(EXTRA_ID, extra_error)

    def _show(self, dom_id: str, message: str) -> None:
        # The line under a field is mounted the first time it has something to say: a dozen
        # empty widgets fewer to style before the first paint.
        if self.shown.get(dom_id, "") == message:
            return
        self.shown[dom_id] = message
        editor = self.query_one(f"#{dom_id}")
        editor.set_class(bool(message), "-error")
        found = self.query(f"#{dom_id}-error")
        if found:
            label = found.first(Static)
            label.update(message)
            label.set_class(bool(message), "-shown")
        elif message:
            self.mount(Static(message, id=f"{dom_id}-error", classes="field-error -shown",
                              markup=False),
                       after=editor.parent if isinstance(editor.parent, Widget) else None)

    def error_text(self, key: str) -> str:
        """The message shown under a field (for tests)."""
        dom_id = EXTRA_ID if key == "extra" else next(s for s in FIELDS if s.key == key).dom_id
        return self.shown.get(dom_id, "")

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        if event.validation_result is not None and event.input.id != EXTRA_ID:
            failures = event.validation_result.failure_descriptions
            self._show(event.input.id or "", failures[0] if failures else "")

    def on_descendant_focus(self, event) -> None:
        """Show the focused field's documentation under the form."""
        wid = getattr(event.widget, "id", "") or ""
        spec = next((s for s in FIELDS if s.dom_id == wid), None)
        text = spec.help() if spec else ("Any setting as table.key=value, separated by "
                                        "spaces." if wid == EXTRA_ID else "")
        self.query_one("#field-help", Static).update(text)
