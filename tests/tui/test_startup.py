"""The app starts without torch, and bad input reaches the user inside the app."""

from __future__ import annotations

import subprocess
import sys

from scripted import click_visible
from textual.widgets import Input

from gputui.tui.app import make_app
from gputui.tui.screens.setup import SetupScreen


def test_importing_and_building_the_app_does_not_import_torch():
    code = ("import sys\n"
            "from gputui.tui.app import make_app\n"
            "from gputui.cli import build_parser\n"
            "app = make_app()\n"
            "import gputui.runs.launcher, gputui.core.registry\n"
            "bad = sorted(m for m in ('torch', 'torchvision', 'numpy') if m in sys.modules)\n"
            "print(','.join(bad) or 'clean')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


async def test_a_missing_dataset_is_refused_in_the_app(tmp_path, inventory, presets):
    app = make_app(preset="quickstart", inventory=inventory, presets=presets,
                   launcher=lambda *a: (_ for _ in ()).throw(AssertionError("launched")))
    async with app.run_test(size=(140, 44), notifications=True) as pilot:
        await pilot.pause()
        await click_visible(pilot, "#f-extra")
        await pilot.press("d")  # typed, then the rest pasted at once (pilot keys are slow)
        app.screen.query_one("#f-extra", Input).insert_text_at_cursor(
            f"ata.name=mnist data.root={tmp_path}")
        await pilot.pause()
        summary = str(app.screen.query_one("#summary").render())
        assert "mnist: missing train-images-idx3-ubyte.gz" in summary
        assert app.screen.query_one("#start").disabled
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert isinstance(app.screen, SetupScreen)
        assert any("mnist: missing" in n.message for n in app._notifications)


async def test_a_lazy_form_answers_from_its_config_until_its_rows_are_in():
    """In a terminal the set-up's form mounts its rows after the first paint: until then it
    answers from its config (what its editors will hold), and an error waits for its row."""
    from textual.app import App

    from gputui.core.config import RunConfig
    from gputui.tui.widgets.param_form import ParamForm

    cfg = RunConfig().replace(run={"epochs": 7}, data={"train_size": 0})
    form = ParamForm(cfg, lazy=True)
    before = form.values()
    assert not form.ready and (before["run.epochs"], before["data.train_size"]) == ("7", "")
    assert form.extra() == ""
    form.show_errors({}, "--set zz=1: the key must be table.key, e.g. optim.lr")

    class OneForm(App):
        def compose(self):
            yield form

    app = OneForm()
    async with app.run_test() as pilot:
        for _ in range(50):
            if form.ready:
                break
            await pilot.pause(0.02)
        assert form.ready and form.values() == before  # the rows hold what it said
        assert form.query_one("#f-run-epochs", Input).value == "7"
        assert form.error_text("extra") == "--set zz=1: the key must be table.key, e.g. optim.lr"


async def test_a_preset_loaded_while_the_lazy_rows_mount_is_what_they_show():
    """The rows are made from the config of their start; a preset loaded before they are in
    (the set-up's list is live meanwhile) must not be lost to them."""
    from textual.app import App

    from gputui.core.config import RunConfig
    from gputui.tui.widgets.param_form import ParamForm

    first = RunConfig().replace(run={"epochs": 7})
    loaded = RunConfig().replace(run={"epochs": 3}, optim={"lr": 0.25})

    class LoadedMeanwhile(ParamForm):
        def _rows(self):
            rows = super()._rows()  # made from `first`
            if not self.ready:
                self.load(loaded)  # the preset arrives while they mount
            return rows

    form = LoadedMeanwhile(first, lazy=True)

    class OneForm(App):
        def compose(self):
            yield form

    async with OneForm().run_test() as pilot:
        for _ in range(50):
            if form.ready:
                break
            await pilot.pause(0.02)
        await pilot.pause()
        assert form.ready
        assert form.query_one("#f-run-epochs", Input).value == "3"
        assert form.values()["run.epochs"] == "3" and form.values()["optim.lr"] == "0.25"


async def test_a_run_started_before_the_warm_host_gets_no_second_host_beside_it(
        tmp_path, presets, monkeypatch):
    """The warm host starts a moment after the set-up is painted; a run started sooner
    (Ctrl+R at once) has a host of its own, and a second one beside it would take a core
    (and a GPU's memory) for the whole run. The warm-up asked for meanwhile is skipped; the
    next is prepared when the run ends. (The host itself is the boundary here: counted, not
    spawned.)"""
    from scripted import fixed_inventory, wait_until

    from gputui.tui.app import GpuTuiApp, make_app

    asked = []
    monkeypatch.setattr(GpuTuiApp, "prepare_warm_start", lambda self, cfg: asked.append(cfg))
    app = make_app(runs_dir=tmp_path / "runs", inventory=fixed_inventory(), presets=presets,
                   warm_start=True)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(asked) == 1, what="the warm-up after the paint")
        app.launching = True  # Ctrl+R before the warm-up's moment
        app._warm_after_paint()
        assert len(asked) == 1
        app.launching = False
        app._warm_after_paint()
        assert len(asked) == 2
