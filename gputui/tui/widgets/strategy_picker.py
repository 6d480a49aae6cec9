"""The strategy choice: every registered strategy with its description; those that cannot run
on the chosen devices are disabled and say why (``gputui.plan.why_not``'s sentence)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from gputui.core import registry
from gputui.plan import caveat, mesh_choices, why_not
from gputui.tui.fmt import app_terms

if TYPE_CHECKING:
    from gputui.core.config import RunConfig
    from gputui.core.devices import Device


class StrategyPicker(Vertical):
    """An option list of strategies plus a detail line for the highlighted one."""

    class Changed(Message):
        """The user picked a strategy."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, selected: str = "single") -> None:
        super().__init__(id="strategies")
        self.border_title = "Strategy"
        self.selected = selected
        self.reasons: dict[str, str] = {}
        self.caveats: dict[str, str] = {}  # what one that can run really does (plan.caveat)
        self.meshes = ""  # the meshes the config allows on these devices (plan.mesh_choices)
        self._built = False  # the options reflect self.reasons and self.selected

    def compose(self) -> ComposeResult:
        yield OptionList(id="strategy-list")
        yield Static("", id="strategy-detail")

    def refresh_for(self, cfg: "RunConfig", devices: list["Device"]) -> None:
        """Recompute which strategies can run with this config on these devices."""
        reasons: dict[str, str] = {}
        caveats: dict[str, str] = {}
        for info in registry.all_infos():
            trial = cfg.replace(strategy={"name": info.name})
            try:
                why = why_not(trial, devices)
                note = None if why else caveat(trial, devices)
            except Exception as exc:  # a strategy's check must not break the screen
                why, note = f"cannot check this strategy ({type(exc).__name__}: {exc})", None
            if why:
                reasons[info.name] = app_terms(why)
            if note:
                caveats[info.name] = app_terms(note)
        meshes = self._meshes(cfg, devices)
        if reasons != self.reasons or caveats != self.caveats or meshes != self.meshes \
                or not self._built:
            self.reasons, self.caveats, self.meshes = reasons, caveats, meshes
            self._rebuild()

    @staticmethod
    def _meshes(cfg: "RunConfig", devices: list["Device"]) -> str:
        """Which meshes of these devices' ranks the config allows, and why not the others
        (the plan's words): what the 'mesh' option shows under its description."""
        try:
            choices = mesh_choices(cfg, devices)
        except Exception:  # noqa: BLE001 - a check must not break the screen
            return ""
        ok = [m.describe() for m, why in choices if why is None]
        refused = [(m.describe(), why) for m, why in choices if why]
        ranks = len(devices) * cfg.dist.nnodes
        text = f"on {ranks} rank{'' if ranks == 1 else 's'}: {', '.join(ok) if ok else 'no mesh'}"
        if refused:
            name, why = refused[0]
            text += (f"; {len(refused)} other mesh{'' if len(refused) == 1 else 'es'} cannot "
                     f"run, e.g. {name}: {app_terms(why)}")
        return text

    def select(self, name: str) -> None:
        """Mark ``name`` as the chosen strategy (e.g. from a preset)."""
        self.selected = name
        self._rebuild()

    def _prompt(self, name: str, description: str) -> Text:
        mark = "●" if name == self.selected else "○"
        text = Text.assemble((f"{mark} {name}", "bold"), "\n", (f"  {description}", "dim"))
        if name in self.reasons:
            text.append(f"\n  ✗ {self.reasons[name]}", style="italic")
        elif name in self.caveats:
            text.append(f"\n  ! {self.caveats[name]}", style="italic")
        if name == "mesh" and self.meshes:  # the degrees are the Mesh fields of the form
            text.append(f"\n  {self.meshes}", style="dim")
        return text

    def _rebuild(self) -> None:
        if not self.is_mounted:
            return
        self._built = True
        ol = self.query_one("#strategy-list", OptionList)
        highlighted = ol.highlighted
        ol.clear_options()
        infos = registry.all_infos()
        known = {i.name for i in infos}
        for info in infos:
            ol.add_option(Option(self._prompt(info.name, info.description), id=info.name,
                                 disabled=info.name in self.reasons))
        if self.selected not in known:
            ol.add_option(Option(Text(f"● {self.selected}\n  ✗ not a registered strategy"),
                                 id=self.selected, disabled=True))
        names = [i.name for i in infos]
        if highlighted is None or highlighted >= len(names) or names[highlighted] in self.reasons:
            enabled = [i for i, n in enumerate(names) if n not in self.reasons]
            want = names.index(self.selected) if self.selected in names else None
            highlighted = want if want in enabled else (enabled[0] if enabled else None)
        ol.highlighted = highlighted
        self._show_detail(self.selected)

    def _show_detail(self, name: str | None) -> None:
        detail = self.query_one("#strategy-detail", Static)
        if name in self.reasons:
            detail.update(Text(f"{name}: cannot run here: {self.reasons[name]}",
                               style="bold"))
            self.add_class("-blocked")
        else:
            detail.update(f"selected: {self.selected}")
            self.remove_class("-blocked")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Enter or a click picks the highlighted strategy."""
        event.stop()
        if event.option_id and event.option_id not in self.reasons:
            self.selected = event.option_id
            self._rebuild()
            self.post_message(self.Changed(self.selected))
