"""The hyperparameter form, validated as you type with the CLI's own messages."""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.validation import ValidationResult, Validator
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Label, Select, Static

from gputui.core.config import RunConfig
from gputui.tui.form import (FIELDS, FieldSpec, check_field, current_value, empty_meaning,
                             field_text)

EXTRA_ID = "f-extra"


class ConfigFieldValidator(Validator):
    """Validates one field by applying it to the config as ``--set`` would."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def validate(self, value: str) -> ValidationResult:
        message = check_field(self.key, value)
        return self.failure(message, value) if message else self.success()


class ParamForm(VerticalScroll):
    """One row per field: label, editor, and the error under it when there is one."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__(id="params")
        self.border_title = "Hyperparameters"
        self.base = config
        self.shown: dict[str, str] = {}  # dom id -> the message under that field

    def compose(self) -> ComposeResult:
        for spec in FIELDS:
            with Horizontal(classes="field-row"):
                yield Label("" if spec.kind == "switch" else spec.label, classes="field-label")
                yield self._editor(spec)
        with Horizontal(classes="field-row"):
            yield Label("More --set", classes="field-label")
            yield Input(placeholder="e.g. data.test_size=500",
                        id=EXTRA_ID, compact=True, select_on_focus=False,
                        tooltip="Any other setting, written as for `gputui run --set`.")
        yield Static("", id="field-help", markup=False)

    def _editor(self, spec: FieldSpec) -> Widget:
        value = current_value(self.base, spec.key)
        if spec.kind == "select":
            return Select([(c, c) for c in spec.choices()], value=value, allow_blank=False,
                          id=spec.dom_id, compact=True, tooltip=spec.help())
        if spec.kind == "switch":
            return Checkbox(spec.label, value=bool(value), id=spec.dom_id, compact=True,
                            tooltip=spec.help())
        return Input(field_text(spec.key, value), placeholder=empty_meaning(spec.key),
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
        out: dict[str, Any] = {}
        for spec in FIELDS:
            out[spec.key] = self._mounted_editor(spec).value
        return out

    def extra(self) -> str:
        """The 'More --set' text: overrides as table.key=value, space separated."""
        return self.query_one(f"#{EXTRA_ID}", Input).value

    def load(self, config: RunConfig) -> None:
        """Show a config's values (after loading a preset)."""
        self.base = config
        for spec in FIELDS:
            widget = self._mounted_editor(spec)
            value = current_value(config, spec.key)
            if isinstance(widget, Input):
                widget.value = field_text(spec.key, value)
            elif isinstance(widget, Checkbox):
                widget.value = bool(value)
            else:
                widget.value = value
        self.query_one(f"#{EXTRA_ID}", Input).value = ""

    def show_errors(self, errors: dict[str, str], extra_error: str = "") -> None:
        """Put each message under its field; clear the others."""
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
