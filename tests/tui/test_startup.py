"""The app starts without torch, and bad input reaches the user inside the app."""

from __future__ import annotations

import subprocess
import sys

from gputui.tui.app import make_app
from gputui.tui.screens.setup import SetupScreen
from textual.widgets import Input


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
        await pilot.click("#f-extra")
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
