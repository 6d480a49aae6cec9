"""The plan screen (F8), driven through Pilot: the set-up's GPT planned for real (the planner's
tracing child, a fake process group under fake tensors) on one H100, the table, the memory
breakdown and the Pareto front it shows, a device it does not fit (answered from the kept
trace), the chosen row written as a preset and loaded into the set-up; bad targets said in the
screen; a plan left half-way ends its child."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import psutil
import pytest
from scripted import wait_until
from textual.widgets import DataTable, Input, Static

from gputui.core.config import load_preset
from gputui.core.mesh import MeshShape
from gputui.tui.app import make_app
from gputui.tui.screens.dialogs import SavePresetDialog
from gputui.tui.screens.plan import PlanScreen, is_tracer
from gputui.tui.screens.setup import SetupScreen
from gputui.tui.widgets.pareto_plot import ParetoPlot
from gputui.tui.widgets.strategy_picker import StrategyPicker

SIZE = (160, 50)
PLAN_TIMEOUT = 600.0  # a cold trace on a loaded 2-core machine; seconds when idle

# A GPT whose memory is mostly its state (2 blocks of width 256, context 8, batch 1): on one
# device there is one mesh to trace, and on a small one it fails for its state, so the plan
# does not trace it again with activation checkpointing.
TINY = """[run]
name = "tiny-plan"
[model]
name = "gpt"
n_layer = 2
n_head = 2
n_embd = 256
[data]
name = "pystdlib"
context = 8
train_size = 64
test_size = 16
[optim]
batch_size = 1
name = "adamw"
[devices]
spec = "cpu"
[strategy]
name = "single"
"""
# a device of 1.01 GiB: under 10 MiB usable once the CUDA context and headroom are off
SMALL = '[Small]\nmemory_gib = 1.01\ntflops = { bf16 = 100.0, fp32 = 50.0 }\n'


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUTUI_PRESETS_DIR", str(tmp_path / "presets"))
    path = tmp_path / "tiny-plan.toml"
    path.write_text(TINY)
    return path


async def open_plan(pilot, app) -> PlanScreen:
    await pilot.press("f8")
    await wait_until(pilot, lambda: isinstance(app.screen, PlanScreen), what="the plan screen")
    return app.screen


async def plan_for(pilot, screen: PlanScreen, gpus: str, profile: str = "") -> None:
    screen.query_one("#plan-gpus", Input).value = gpus
    screen.query_one("#plan-profile", Input).value = profile
    await pilot.press("ctrl+r")  # from kept traces the plan may be shown already
    await wait_until(pilot, lambda: not screen.planning, timeout=PLAN_TIMEOUT, what="the plan")
    await pilot.pause()


def text(screen: PlanScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def cells(screen: PlanScreen, key: str) -> list[str]:
    return [str(c) for c in screen.query_one(DataTable).get_row(key)]


async def test_plan_fit_front_no_fit_and_the_row_into_a_run(tmp_path, tiny, inventory,
                                                            presets):
    app = make_app(preset=tiny, runs_dir=tmp_path / "runs", inventory=inventory,
                   presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_plan(pilot, app)
        assert "Plans tiny-plan: a 1.6M-parameter GPT" in text(screen, "#plan-status")

        await plan_for(pilot, screen, "H100")
        assert "1xH100-SXM: 1 mesh planned, 1 fits" in text(screen, "#plan-status")
        row = cells(screen, "1")
        # the one mesh of one device, on the front: fsdp over one rank, fits, with figures
        assert row[:6] == ["1*", "fsdp", "1 rank", "-", "none", "yes"]
        assert row[6].endswith("s") and row[7] != "-" and row[-1] == ""
        detail = text(screen, "#plan-row")
        assert "row 1: fsdp, 1 rank" in detail and "fits in" in detail
        assert "optimizer state" in detail and "tokens/s" in detail
        assert "compute efficiency 0.45" in text(screen, "#plan-notes")
        plot = screen.query_one(ParetoPlot)
        assert [p.number for p in plot.front] == ["1"] and plot.selected == "1"

        # ctrl+s: the row as a preset, written where the dialog says
        chosen = tmp_path / "chosen.toml"
        await pilot.press("ctrl+s")
        await pilot.pause()
        dialog_input = app.screen.query_one("#preset-path", Input)
        dialog_input.value = str(chosen)
        await pilot.press("enter")
        await wait_until(pilot, chosen.is_file, what="the preset written")
        assert app.screen is screen
        first = chosen.read_text()
        assert first.startswith("# From `gputui plan tiny-plan --gpus 1xH100-SXM`: mesh 1 rank")
        cfg = load_preset(chosen)
        assert cfg.strategy.name == "mesh" and cfg.model.n_embd == 256
        assert (cfg.parallel.dp_shard, cfg.parallel.tp, cfg.parallel.pp) == (1, 1, 1)

        # a device too small: answered from the trace kept by the first plan, no fit, why
        small = tmp_path / "small.toml"
        small.write_text(SMALL)
        await plan_for(pilot, screen, "Small", str(small))
        assert "1xSmall: 1 mesh planned, 0 fit" in text(screen, "#plan-status")
        row = cells(screen, "1")
        assert row[0] == "1" and row[5] == "no"  # not on the front: nothing fits
        assert row[-1].startswith("parameters, gradients and optimizer state of")
        assert "does not fit: parameters, gradients" in text(screen, "#plan-row")
        assert plot.front == [] and [p.fits for p in plot.points] == [False]

        # ctrl+e: the row into the set-up form, ready to edit and run
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: isinstance(app.screen, SetupScreen),
                         what="the set-up")
        setup = app.screen
        assert setup.query_one(StrategyPicker).selected == "mesh"
        assert "plan row 1" in setup.sub_title


def tracers() -> list:
    return [p for p in multiprocessing.active_children() if is_tracer(p.name)]


async def test_bad_input_said_in_the_screen_and_a_plan_left_half_way_ends_its_child(
        tmp_path, tiny, inventory, presets):
    app = make_app(runs_dir=tmp_path / "runs", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_plan(pilot, app)  # the app's default: a LeNet
        lenet = "traces the built-in GPT (model.name = 'gpt'); this preset trains 'lenet'"
        assert lenet in text(screen, "#plan-status")
        assert "load a GPT preset in the set-up first" in text(screen, "#plan-status")
        await pilot.press("ctrl+r")
        assert lenet in text(screen, "#plan-status") and not screen.planning
        await pilot.press("escape")
        assert isinstance(app.screen, SetupScreen)
        assert app.screen.load_preset(tiny)
        await pilot.pause()

        screen = await open_plan(pilot, app)
        status = screen.query_one("#plan-status", Static)
        for gpus, nodes, profile, error in (
                ("3xNOPE", "1", "", "GPUs: no profile for 'NOPE'; known: A100-40GB"),
                ("8 H100", "1", "", "GPUs 8 H100: give COUNTxDEVICE, e.g. 8xH100"),
                ("8xH100", "0", "", "nodes 0: give a whole number, 1 or more"),
                ("8xH100", "two", "", "nodes 'two': give a whole number"),
                ("8xH100", "1", str(tmp_path / "none.toml"), "none.toml: no such file")):
            screen.query_one("#plan-gpus", Input).value = gpus
            screen.query_one("#plan-nodes", Input).value = nodes
            screen.query_one("#plan-profile", Input).value = profile
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: not screen.planning, what="the refusal")
            await pilot.pause()
            assert error in str(status.render()) and status.has_class("-error")
            assert screen.plan is None  # nothing traced, nothing shown
        assert not (tmp_path / "cache" / "plan-traces.json").exists()
        await pilot.press("ctrl+s")  # no plan yet: said, nothing written
        assert not (tmp_path / "presets").exists()

        # a plan of 2 GPUs (7 meshes): each mesh's row joins the table as it is traced,
        # while the child traces the rest; a row so far is not one to write
        screen.query_one("#plan-gpus", Input).value = "2xH100"
        screen.query_one("#plan-nodes", Input).value = "1"
        screen.query_one("#plan-profile", Input).value = ""
        await pilot.press("ctrl+r")
        table = screen.query_one(DataTable)
        await wait_until(pilot, lambda: table.row_count > 0 or not screen.planning,
                         timeout=PLAN_TIMEOUT, what="the first mesh's row")
        assert screen.planning and tracers(), text(screen, "#plan-status")
        assert "traced so far" in text(screen, "#plan-status")
        first = cells(screen, "1")
        assert first[0].startswith("1") and first[5] == "yes" and first[6].endswith("s")
        await pilot.press("ctrl+s")  # the plan is not whole: nothing written
        await pilot.pause()
        assert not isinstance(app.screen, SavePresetDialog)
        assert not (tmp_path / "presets").exists()
        # left while its child traces: the child is ended; every mesh shown was kept first
        shown = [(r.shape.describe(), r.shape.zero) for r in screen.so_far]
        pids = [p.pid for p in tracers()]
        await pilot.press("escape")
        assert isinstance(app.screen, SetupScreen)
        await wait_until(pilot, lambda: all(gone(pid) for pid in pids), timeout=PLAN_TIMEOUT,
                         what="the tracing child to end")
        kept = json.loads((tmp_path / "cache" / "plan-traces.json").read_text())
        specs = [json.loads(key.split("|", 3)[3])["mesh"] for key in kept]
        kept_meshes = [(MeshShape(**m).describe(), m["zero"]) for m in specs]
        assert shown and all(mesh in kept_meshes for mesh in shown), (shown, kept_meshes)


def gone(pid: int) -> bool:
    """The process has ended (a zombie until its parent's thread reaps it, or reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
