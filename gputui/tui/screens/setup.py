"""The set-up screen: devices, strategy, hyperparameters and presets, then Start."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Checkbox, Footer, Header, Input, Select, Static

from gputui.core.config import (
    ConfigError, RunConfig, effective_batch_size, effective_lr, load_preset)
from gputui.core.events import plural
from gputui.core.presets import user_presets_dir
from gputui.core.usercode import code_line
from gputui.tui.defaults import BUILTINS, SLOW_NOTE, builtin, learns_slowly
from gputui.tui.fmt import app_terms
from gputui.tui.form import FIELD_BY_KEY, FormResult, build, files_problem, reads_disk
from gputui.tui.inventory import Inventory
from gputui.tui.messages import (FilesChecked, InventoryReady, SetupChanged, SetupShown,
                                 StartRun)
from gputui.tui.screens.dialogs import save_preset
from gputui.tui.estimate import UNKNOWN_GPU
from gputui.tui.screens.setup_estimate import SetupEstimate
from gputui.tui.widgets.device_picker import DevicePicker
from gputui.tui.widgets.param_form import ParamForm
from gputui.tui.widgets.preset_panel import PresetPanel, available_presets
from gputui.tui.widgets.strategy_picker import StrategyPicker
from gputui.tui.widgets.too_small import TooSmall

INVENTORY_EVERY_S = 3.0


class SetupScreen(SetupEstimate, Screen):
    """Everything a run needs, validated live; Ctrl+R starts it."""

    BINDINGS = [
        Binding("ctrl+r", "start", "Start run", priority=True),
        Binding("ctrl+s", "save_preset", "Save preset", priority=True),
        Binding("ctrl+o", "focus_widget('preset-list')", "Presets"),
        Binding("f2", "focus_widget('device-table')", "Devices"),
        Binding("f3", "focus_widget('strategy-list')", "Strategy"),
        Binding("f4", "focus_widget('f-model-name')", "Form"),
    ]

    def __init__(self, config: RunConfig, *, preset: Path | None = None,
                 inventory: Inventory | None = None,
                 discover: Callable[[], Inventory] | None = None,
                 presets: list[Path] | None = None, runs_dir: Path | None = None) -> None:
        super().__init__(id="setup")
        self.runs_dir = runs_dir  # earlier runs, for the estimate before Start (None: none)
        self.base = config
        self.preset = preset
        self.inventory = inventory or Inventory()
        self.discover = discover  # None: the inventory given is all there is (tests)
        self.presets = presets if presets is not None else available_presets()
        self.result: FormResult | None = None
        self._revalidate_due = False
        # The files a config names are checked off the UI thread: the key of the config last
        # sent to be checked, and the last answer as (key, problem).
        self._files_asked: str | None = None
        self._files_answer: tuple[str, str | None] | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="setup-top"):
            yield DevicePicker(self.inventory, self.base.devices.spec,
                               self.base.devices.fallback)
            yield StrategyPicker(self.base.strategy.name)
        with Horizontal(id="setup-bottom"):
            # in a terminal the form's rows come after the first paint (a headless app,
            # tests and snapshots included, paints nothing to wait for)
            yield ParamForm(self.base, lazy=not self.app.is_headless)
            with Vertical(id="setup-side"):
                panel = PresetPanel(self.presets, {k: v[0] for k, v in BUILTINS.items()})
                panel.loaded = self.preset
                yield panel
                # Start is docked at the side's foot: however long the notes above it grow
                # (a preset naming code, a slow one, an estimate), it stays on the screen and
                # the notes scroll
                yield Button("Start run (ctrl+r)", id="start", variant="success")
                with VerticalScroll(id="setup-notes"):
                    yield Static("", id="code-marker", classes="-none")
                    yield Static(SLOW_NOTE, id="slow-note", classes="-none", markup=False)
                    yield Static("", id="summary", markup=False)
        yield Footer()
        yield TooSmall()

    def on_mount(self) -> None:
        self.sub_title = f"set-up · {self.preset.stem}" if self.preset else "set-up"
        note = self.query_one(DevicePicker).spec_note
        if note:
            self.notify(note, severity="warning", timeout=8)
        self.revalidate()
        if self.discover is not None:
            self.set_interval(INVENTORY_EVERY_S, self.refresh_inventory)
        if self.query_one(ParamForm).ready:
            self.call_after_refresh(self._painted)
        # else once the form's rows are in (on_param_form_ready)

    def _painted(self) -> None:
        """Painted whole: now the threads (discovery, the history) and the app's warm host,
        whose imports (and torch's) would have held the GIL and the cores the paint needed."""
        self.painted = True
        if self.discover is not None:
            self.refresh_inventory()
        self.read_history()
        self.post_message(SetupShown())

    # ------------------------------------------------------------------ inventory
    @work(thread=True, exclusive=True, group="inventory", exit_on_error=False)
    def refresh_inventory(self) -> None:
        """Read NVML and psutil off the UI thread (not while another screen is on top)."""
        if self.discover is not None and self.is_current:
            self.post_message(InventoryReady(self.discover()))

    def on_inventory_ready(self, message: InventoryReady) -> None:
        """Fresh device readings for the table."""
        self.inventory = message.inventory
        note = self.query_one(DevicePicker).set_inventory(message.inventory)
        if note:
            self.notify(note, severity="warning", timeout=8)
        self._files_asked = None  # look at the disk again too: files may have come or gone
        self.revalidate()

    # ------------------------------------------------------------------ validation
    def revalidate(self, files_now: bool = False) -> FormResult:
        """Build the config from what the screen shows; update errors, strategies, summary.

        Runs on every change (and every discovery): the rules are checked against the devices
        of the last discovery, never asking NVML, and the disk is read off this thread
        (:meth:`check_files`), or here with ``files_now`` (Start)."""
        self._revalidate_due = False
        form = self.query_one(ParamForm)
        picker = self.query_one(DevicePicker)
        strategies = self.query_one(StrategyPicker)
        values, extra = form.values(), form.extra()
        if picker.waiting:  # nothing to check against until the GPUs are known
            self.result = FormResult(None, {}, f"waiting for GPU discovery to apply devices.spec "
                                               f"'{picker.spec}'")
            self._show_summary(self.result, 0)
            return self.result
        devices = picker.devices()
        loose = build(self.base, values, picker.spec, strategies.selected, extra, check=False)
        strategies.refresh_for(loose.config or self.base, devices)
        result = self._with_files(build(self.base, values, picker.spec, strategies.selected,
                                        extra, devices=devices, files=False), files_now)
        form.show_errors(result.field_errors, loose.error)
        self.result = result
        self._show_summary(result, len(picker.devices()))
        self.post_message(SetupChanged(result.config or self.base))
        return result

    def _with_files(self, result: FormResult, now: bool = False) -> FormResult:
        """``result`` with what the disk says of the files its config names. A config that
        names none is checked here (no disk is read), and so is any with ``now``; otherwise
        the check runs off this thread when the config's files change, and until it answers
        the last answer stands."""
        cfg = result.config
        if cfg is None:  # not ok
            return result
        if now or not reads_disk(cfg):
            problem = files_problem(cfg, result.origins)
            if now:
                self._files_asked = key = _files_key(result)
                self._files_answer = (key, problem)
        else:
            key = _files_key(result)
            if key != self._files_asked:
                self._files_asked = key
                self.check_files(result, key)
            problem = self._files_answer[1] if self._files_answer else None
        return FormResult(None, {}, problem, result.origins) if problem else result

    @work(thread=True, exclusive=True, group="files", exit_on_error=False)
    def check_files(self, result: FormResult, key: str) -> None:
        """Read the disk for the files ``result``'s config names (off the UI thread)."""
        assert result.config is not None  # _with_files asks only for a valid config
        self.post_message(FilesChecked(key, files_problem(result.config, result.origins)))

    def on_files_checked(self, message: FilesChecked) -> None:
        """The disk's answer; an answer for a config since changed is dropped."""
        if message.key == self._files_asked:
            self._files_answer = (message.key, message.problem)
            self.revalidate()

    def _show_summary(self, result: FormResult, n: int) -> None:
        summary = self.query_one("#summary", Static)
        start = self.query_one("#start", Button)
        # A preset that names code says so before Start (the code runs only in the run).
        code = code_line(result.config or self.base)
        marker = self.query_one("#code-marker", Static)
        marker.update(f"⚠ {code}" if code else "")
        marker.set_class(not code, "-none")
        self.query_one("#slow-note").set_class(not learns_slowly(result.config or self.base),
                                               "-none")
        cfg = result.config
        if cfg is not None:  # ok
            text = (f"Ready: {cfg.strategy.name} on {cfg.devices.spec} · {cfg.model.label} on "
                    f"{cfg.data.label} · {plural(cfg.run.epochs, 'epoch')} · global batch "
                    f"{effective_batch_size(cfg, n)} · lr {effective_lr(cfg, n):g}")
            text += self.time_text(cfg, n, self._gpu_name())
        elif result.field_errors:
            first = next(iter(result.field_errors))
            text = (f"✗ {plural(len(result.field_errors), 'field')} to fix, first: "
                    f"{FIELD_BY_KEY[first].label}")
        else:
            text = f"✗ {app_terms(result.error)}"
        summary.update(text)
        summary.tooltip = (self.time_hint or None) if cfg is not None else None
        summary.set_class(not result.ok, "-invalid")
        start.disabled = not result.ok

    def _gpu_name(self) -> str:
        """The first chosen GPU's name as the last discovery gave it ('' on CPU devices,
        UNKNOWN_GPU when it gave none)."""
        picker = self.query_one(DevicePicker)
        index = next((d.index for d in picker.devices() if d.kind == "cuda"), None)
        if index is None:
            return ""
        return next((g.name for g in picker.inventory.gpu_infos if g.index == index and g.name),
                    UNKNOWN_GPU)

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Checkbox.Changed)
    @on(DevicePicker.Changed)
    @on(StrategyPicker.Changed)
    def _changed(self) -> None:
        # Many change events come at once (mounting, loading a preset): validate once for all.
        if self.is_mounted and not self._revalidate_due:
            self._revalidate_due = True
            self.call_later(self.revalidate)

    # ------------------------------------------------------------------ actions
    def action_focus_widget(self, widget_id: str) -> None:
        """Move the focus to one part of the screen (the form's, once its rows are in)."""
        for widget in self.query(f"#{widget_id}"):
            widget.focus()

    def on_param_form_ready(self) -> None:
        """The form's rows are in (after the first paint): check what they hold."""
        self.revalidate()
        self.call_after_refresh(self._painted)

    def action_start(self) -> None:
        """Start the run if the config is valid; otherwise say what is wrong."""
        result = self.revalidate(files_now=True)  # the disk, read now whatever it said before
        if result.config is None:  # not ok
            message = next(iter(result.field_errors.values()), "") or result.error
            self.notify(app_terms(message), title="Cannot start", severity="error", timeout=8)
            return
        self.post_message(StartRun(result.config))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """The Start button."""
        if event.button.id == "start":
            self.action_start()

    def on_preset_panel_load(self, message: PresetPanel.Load) -> None:
        """Load a preset into every part of the screen."""
        self.load_preset(message.path)

    def on_preset_panel_load_builtin(self, message: PresetPanel.LoadBuiltin) -> None:
        """Load one of the app's own settings (its default, the material's)."""
        label = BUILTINS[message.name][0]
        self._show_config(builtin(message.name), None, label.split(" (")[0], label)

    def load_preset(self, path: Path) -> bool:
        """Read a preset; a bad one is reported here and changes nothing."""
        try:
            cfg = load_preset(path)
        except ConfigError as exc:
            self.notify(str(exc), title="Cannot load preset", severity="error", timeout=10)
            return False
        self._show_config(cfg, path, path.stem, f"preset {path.stem}")
        return True

    def show_config(self, cfg: RunConfig, name: str) -> None:
        """A config made elsewhere (a plan's row) in every part of the screen, to run."""
        self._show_config(cfg, None, name, name)

    def _show_config(self, cfg: RunConfig, path: Path | None, name: str, what: str) -> None:
        self.base, self.preset = cfg, path
        self.query_one(ParamForm).load(cfg)
        note = self.query_one(DevicePicker).set_spec(cfg.devices.spec, cfg.devices.fallback)
        self.query_one(StrategyPicker).select(cfg.strategy.name)
        self.query_one(PresetPanel).set_presets(self.presets, path)
        self.sub_title = f"set-up · {name}"
        self.revalidate()
        self.notify(f"Loaded {what}" + (f" ({note})" if note else ""),
                    severity="warning" if note else "information")

    def on_preset_panel_save_requested(self) -> None:
        self.action_save_preset()

    def action_save_preset(self) -> None:
        """Ask for a file name and write the form as a preset."""
        result = self.revalidate()
        cfg = result.config
        if cfg is None:  # not ok
            self.notify("Fix the form before saving it as a preset", severity="error")
            return

        def saved(path: Path, name: str) -> None:
            if not path.is_file():  # a device or a pipe took the bytes: no preset to run
                self.notify(f"Wrote the preset to {path}", timeout=8)
                return
            if path not in self.presets and path.parent == user_presets_dir():
                self.presets = sorted([*self.presets, path])
            self.preset = path
            self.query_one(PresetPanel).set_presets(self.presets, path)
            self.notify(f"Saved {path}; run it with `gputui run {name}`", timeout=8)

        save_preset(self, cfg.run.name, cfg.to_toml(), saved)


def _files_key(result: FormResult) -> str:
    """What the file checks of a form's config depend on: its data, factories, batch size,
    checkpoint to resume, the cut of a factory's model into stages (strategy, devices, split
    points: see runs/model_check.py), and which source set each key (the message names it)."""
    cfg = result.config
    assert cfg is not None  # asked only for a valid config
    return repr((cfg.data, cfg.model.factory, cfg.model.kwargs, cfg.optim.batch_size,
                 cfg.run.resume_from, cfg.strategy.name, cfg.devices.spec,
                 cfg.strategy.split_points, sorted(result.origins.items())))
