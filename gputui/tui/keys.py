"""F1's keys panel with the app's own keys first: Textual lists the focused widget's bindings
first (an input's dozen text-editing keys), which hid what the app itself offers; here the
app's and the screen's come first and the focused widget's follow."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.screen import Screen
from textual.widgets import HelpPanel, KeyPanel, Markdown
from textual.widgets._key_panel import BindingsTable


def app_first(active: dict) -> dict:
    """A screen's active bindings (key -> (namespace, binding, enabled, tooltip)), the app's
    and the screen's first, each group in Textual's own order."""
    return dict(sorted(active.items(),
                       key=lambda kv: 0 if isinstance(kv[1][0], (App, Screen)) else 1))


class AppFirstBindings(BindingsTable):
    """The bindings table, rendered from the screen's bindings in ``app_first`` order."""

    def render_bindings_table(self):
        cls = type(self.screen)
        ordered = app_first(self.screen.active_bindings)
        own = vars(cls).get("active_bindings")
        # Textual's renderer reads screen.active_bindings: hand it the order wanted, for the
        # length of this call (the UI thread's), then put the class back as it was
        cls.active_bindings = property(lambda _: ordered)  # type: ignore[method-assign, assignment]
        try:
            return super().render_bindings_table()
        finally:
            if own is None:
                del cls.active_bindings
            else:
                cls.active_bindings = own  # type: ignore[method-assign]


class AppKeyPanel(KeyPanel):
    def compose(self) -> ComposeResult:
        yield AppFirstBindings(shrink=True, expand=False)


class AppHelpPanel(HelpPanel):
    """Textual's help panel (the focused widget's help, then the keys), app keys first."""

    def compose(self) -> ComposeResult:
        yield Markdown(id="widget-help")
        yield AppKeyPanel(id="keys-help")
