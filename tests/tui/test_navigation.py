"""Every screen opens from anywhere, in any order, with a run active: the README's keys walked
as a de Bruijn sequence (every sequence of three keys appears in it once), the app checked
after each key. Then F7 during a run, and markup typed into the form."""

from __future__ import annotations

import itertools

from scripted import FakeHandle, ScriptedLauncher, fixed_inventory, run_events, wait_until

from textual.screen import ModalScreen

from gputui.tui.app import make_app
from gputui.tui.screens.history import HistoryScreen
from gputui.tui.screens.run import RunScreen
from gputui.tui.screens.sweep import SweepScreen

KEYS = ["f6", "f7", "enter", "escape", "space"]  # the README's "anywhere" keys and the
# history's, and escape (back; on the run screen it asks first)


def de_bruijn(k: int, n: int) -> list[int]:
    """A cyclic sequence over range(k) holding every length-n word once (the standard
    recursive construction)."""
    a, out = [0] * k * n, []

    def db(t: int, p: int) -> None:
        if t > n:
            if n % p == 0:
                out.extend(a[1:p + 1])
        else:
            a[t] = a[t - p]
            db(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                db(t + 1, t)

    db(1, 1)
    return out


def test_the_walk_holds_every_three_key_sequence():
    seq = de_bruijn(len(KEYS), 3)
    cyclic = seq + seq[:2]
    words = {tuple(cyclic[i:i + 3]) for i in range(len(seq))}
    assert words == set(itertools.product(range(len(KEYS)), repeat=3))


class SlowToStop(FakeHandle):
    """A run that stays active after a stop request (the walk's escape + enter asks one)."""

    def stop(self, reason: str = "stopped by user") -> None:
        self.stop_calls += 1


def _app(tmp_path, presets, launcher):
    """The app on the quickstart preset with a scripted launcher and a fixed inventory."""
    return make_app(preset="quickstart", runs_dir=tmp_path / "runs", launcher=launcher,
                    inventory=fixed_inventory(), presets=presets)


async def _start_run(pilot, app) -> None:
    """Ctrl+R on the set-up screen, then wait for the run screen."""
    await pilot.pause()
    await pilot.press("ctrl+r")
    await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")


async def test_every_key_sequence_with_a_run_active_keeps_the_app_and_the_run(tmp_path,
                                                                               presets):
    launcher = ScriptedLauncher(lambda cfg: SlowToStop(run_events(), hold_terminal=True))
    app = _app(tmp_path, presets, launcher)
    async with app.run_test(size=(140, 44)) as pilot:
        await _start_run(pilot, app)
        seq = de_bruijn(len(KEYS), 3)
        for i in seq + seq[:2]:
            await pilot.press(KEYS[i])
            await pilot.pause()
            ids = [s.id for s in app.screen_stack]
            assert len(ids) == len(set(ids)), ids
            assert app.is_running and app.return_code is None
            assert app.run_active and launcher.handles[0].kill_calls == 0
        # F6 and F7 still reach their screens from wherever the walk ended (a question
        # asked in a dialog is answered first: escape, i.e. stay)
        while isinstance(app.screen, ModalScreen):
            await pilot.press("escape")
            await pilot.pause()
        await pilot.press("f6")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen),
                         what=f"history from {[s.id for s in app.screen_stack]}")
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, SweepScreen), what="sweep")
        assert app.run_active


async def test_f7_during_a_run_opens_the_sweep_and_says_why_it_cannot_start(tmp_path,
                                                                             presets):
    launcher = ScriptedLauncher()
    app = _app(tmp_path, presets, launcher)
    async with app.run_test(size=(140, 44)) as pilot:
        await _start_run(pilot, app)
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, SweepScreen), what="the sweep")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not app.screen.running and len(launcher.handles) == 1
        notes = [n.message for n in app._notifications]
        assert any("A run is active" in m for m in notes), notes


async def _type_into(pilot, app, dom_id: str, text: str) -> None:
    app.screen.query_one(f"#{dom_id}").focus()
    await pilot.press("ctrl+a", "ctrl+k", *text)
    await pilot.pause(0.3)


async def test_square_brackets_typed_into_the_form_are_text_not_markup(presets):
    from textual.widgets import Static

    from gputui.tui.widgets.param_form import ParamForm

    app = make_app(preset="quickstart", launcher=ScriptedLauncher(),
                   inventory=fixed_inventory(), presets=presets)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        form = app.screen.query_one(ParamForm)
        await _type_into(pilot, app, "f-run-epochs", "[/]")
        assert app.is_running and app.return_code is None
        assert "[/]" in form.error_text("run.epochs")
        await _type_into(pilot, app, "f-run-epochs", "2")
        await _type_into(pilot, app, "f-extra", "[/x].a=1")
        await pilot.press("ctrl+r")  # the --set text is read when the run starts
        await pilot.pause(0.3)
        assert app.is_running and app.return_code is None
        shown = [str(s.render()) for s in app.screen.query(Static)]
        messages = [n.message for n in app._notifications] + shown
        assert any("[/x]" in m for m in messages) or "[/x]" in form.error_text("extra"), messages
        await _type_into(pilot, app, "f-extra", "foo.bar=1")
        await pilot.press("ctrl+r")
        await pilot.pause(0.3)
        notes = [n.message for n in app._notifications] + [form.error_text("extra")]
        assert any("[foo]" in m for m in notes), notes  # the message keeps its brackets


async def test_f7_says_how_many_runs_the_grid_makes_and_how_long_by_earlier_runs(tmp_path,
                                                                                presets):
    """The sweep screen did not say how many runs its grid makes nor how long they take."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from run_records import write_record

    runs = tmp_path / "runs"
    app = make_app(preset="quickstart", runs_dir=runs, launcher=ScriptedLauncher(),
                   inventory=fixed_inventory(), presets=presets)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, SweepScreen), what="the sweep")
        screen = app.screen
        await wait_until(pilot, lambda: screen.history is not None, what="the history")
        await _type_into(pilot, app, "sweep-strategies", "single,scratch")
        plan = str(screen.query_one("#sweep-plan").render())
        assert plan.startswith("grid: 2 device counts x 2 strategies = 4 runs"), plan
        assert plan.endswith("= 4 runs; time unknown: none of them has run here before"), plan
    # one point's work ran here before (quickstart's model, data, batch: 120 s an epoch)
    from gputui.core.config import load_preset

    base = load_preset(presets[0])
    row = write_record(runs, "20260101-100000-quickstart-aaaa", "single", 1,
                       batch=base.optim.batch_size, lr=base.optim.lr,
                       sps=base.data.train_size / 120, train_size=base.data.train_size,
                       model=base.model.name, epochs=2)
    assert row.exists()
    app = make_app(preset="quickstart", runs_dir=runs, launcher=ScriptedLauncher(),
                   inventory=fixed_inventory(), presets=presets)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, SweepScreen), what="the sweep")
        screen = app.screen
        await wait_until(pilot, lambda: screen.history is not None, what="the history")
        await _type_into(pilot, app, "sweep-strategies", "single,scratch")
        plan = str(screen.query_one("#sweep-plan").render())
        minutes = round((120 * base.run.epochs + 2.5) / 60)
        assert plan.endswith(f"; about {minutes} min by earlier runs here (3 never ran here: "
                             f"not counted)"), plan
