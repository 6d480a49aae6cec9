"""The set-up screen, driven with keys and clicks through Pilot."""

from __future__ import annotations

from scripted import ScriptedLauncher, fixed_inventory, wait_until

from gputui.core.config import load_preset
from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen
from gputui.tui.screens.setup import SetupScreen
from gputui.tui.widgets.device_picker import DevicePicker
from gputui.tui.widgets.param_form import ParamForm
from gputui.tui.widgets.strategy_picker import StrategyPicker
from textual.widgets import DataTable, Input, OptionList, Select

SIZE = (140, 44)


def setup_of(app) -> SetupScreen:
    assert isinstance(app.screen, SetupScreen)
    return app.screen


async def test_cpu_devices_listed_with_the_reason_there_is_no_gpu(inventory, presets):
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.screen.query_one("#device-table", DataTable)
        assert [str(k.value) for k in table.rows] == ["cpu:0"]  # the defaults: devices.spec cpu
        assert table.get_row("cpu:0")[0] == "✔"
        note = str(app.screen.query_one("#no-gpu-note").render())
        assert note.startswith("No GPU is listed because no NVIDIA driver could be loaded")
        # Choose 3 CPU virtual devices with the keyboard.
        app.screen.query_one("#cpu-count", Select).focus()
        await pilot.press("enter", "down", "down", "enter")
        await pilot.pause()
        assert app.screen.query_one(DevicePicker).spec == "cpu*3"
        assert [str(k.value) for k in table.rows] == ["cpu:0", "cpu:1", "cpu:2"]
        # Space on a CPU row cannot toggle it: the app says why instead of doing nothing.
        table.focus()
        await pilot.press("space")
        await pilot.pause()
        assert app.screen.query_one(DevicePicker).spec == "cpu*3"
        (note,) = [n for n in app._notifications if n.title == "CPU virtual devices"]
        assert note.message.startswith("A CPU row cannot be toggled on its own")


async def test_gpu_rows_toggle_and_build_an_index_spec(presets):
    app = make_app(inventory=fixed_inventory(gpus=3), presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        picker = app.screen.query_one(DevicePicker)
        table = app.screen.query_one("#device-table", DataTable)
        table.focus()
        await pilot.press("enter", "down", "down", "space")  # GPU 0 and GPU 2
        await pilot.pause()
        assert picker.spec == "0,2"
        assert table.get_row("cuda:1")[0] == "·"
        await pilot.press("up", "up", "enter")  # GPU 0 off again
        assert picker.spec == "cuda:2"
        assert not app.screen.query_one("#no-gpu-note").display


async def test_strategies_disabled_with_the_reason(inventory, presets):
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        strategies = app.screen.query_one(StrategyPicker)
        options = app.screen.query_one("#strategy-list", OptionList)
        assert strategies.selected == "single" and "single" not in strategies.reasons  # 1 device
        assert not app.screen.query_one("#start").disabled
        # Two devices: single cannot run there, and says why.
        app.screen.query_one("#cpu-count", Select).value = 2
        await pilot.pause()
        assert "uses 1 device" in strategies.reasons["single"]
        assert options.get_option("single").disabled
        assert not options.get_option("scratch").disabled
        # dp can run on two CPU devices, and says what it really does there
        assert "unreplicated" in strategies.caveats["dp"] and "dp" not in strategies.reasons
        assert "unreplicated" in str(options.get_option("dp").prompt)
        assert "strategy 'single' uses 1 device" in str(app.screen.query_one("#summary").render())
        assert app.screen.query_one("#start").disabled
        # Pick scratch with the keyboard: the set-up becomes valid.
        options.focus()
        options.highlighted = 1
        await pilot.press("enter")
        await pilot.pause()
        assert strategies.selected == "scratch"
        assert setup_of(app).result.ok
        assert not app.screen.query_one("#start").disabled


async def test_fields_validated_as_you_type_with_cli_messages(inventory, presets):
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        form = app.screen.query_one(ParamForm)
        await pilot.click("#f-optim-lr")
        await pilot.press("ctrl+a", "ctrl+k", "minus", "1")
        await pilot.pause()
        assert form.error_text("optim.lr") == "form: optim.lr must be greater than 0.0, got -1.0"
        assert app.screen.query_one("#start").disabled
        await pilot.press("ctrl+a", "ctrl+k", *"0.05")
        await pilot.pause()
        assert form.error_text("optim.lr") == ""
        assert setup_of(app).result.config.optim.lr == 0.05
        # A cross-field problem lands in the summary line.
        app.screen.query_one("#f-run-precision", Select).value = "fp16"
        await pilot.pause()
        summary = str(app.screen.query_one("#summary").render())
        assert "needs CUDA devices" in summary
        # Starting anyway is refused inside the app, not by a crash.
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert isinstance(app.screen, SetupScreen)


async def test_load_preset_from_the_list(inventory, presets):
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+o", "enter")
        await pilot.pause()
        screen = setup_of(app)
        cfg = screen.result.config
        expected = load_preset(presets[0])
        assert cfg.to_dict() == expected.to_dict()
        assert app.screen.query_one("#f-run-epochs", Input).value == "3"
        assert app.screen.query_one(StrategyPicker).selected == "scratch"


async def test_bad_preset_is_reported_in_the_app(tmp_path, inventory, presets):
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlr = -1\n")
    app = make_app(preset=str(bad), inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, SetupScreen)
        messages = [n.message for n in app._notifications]
        assert any("optim.lr must be greater than 0.0" in m for m in messages)


async def test_save_as_preset_writes_a_file_gputui_run_accepts(tmp_path, inventory, presets):
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.click("#f-run-epochs")
        await pilot.press("ctrl+a", "ctrl+k", "7")
        await pilot.press("ctrl+s")
        await pilot.pause()
        path_input = app.screen.query_one("#preset-path", Input)
        target = tmp_path / "mine.toml"
        path_input.value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        assert target.exists()
        saved = load_preset(target)  # validated as `gputui run` would
        assert saved.run.epochs == 7 and saved.strategy.name == "scratch"


async def test_save_as_preset_onto_a_folder_says_so_in_the_dialog(tmp_path, inventory,
                                                                   presets):
    folder = tmp_path / "taken.toml"
    folder.mkdir()
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("#preset-path", Input).value = str(folder)
        await pilot.press("enter")
        await pilot.pause()
        shown = str(app.screen.query_one("#save-error").render())
        assert "it is a folder; give a file name" in shown, shown
        assert folder.is_dir() and not list(folder.iterdir())  # nothing written


async def test_save_as_preset_to_a_device_or_pipe_writes_there_not_to_a_toml_beside_it(
        tmp_path, inventory, presets):
    """Saving to /dev/null wrote /dev/null.toml: a path that is there is written as given,
    as `-o` writes it (a named pipe stands for the device here)."""
    import os
    import threading

    pipe = tmp_path / "sink"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("#preset-path", Input).value = str(pipe)
        await pilot.press("enter")
        await pilot.pause()
        reader.join(timeout=60)
        assert got and b"[strategy]" in got[0]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sink"]  # no sink.toml
        assert any(n.message == f"Wrote the preset to {pipe}" for n in app._notifications)


async def test_a_factory_model_shows_as_its_code_and_text_data_has_a_path_field(
        tmp_path, inventory, presets):
    """The set-up screen showed "Model: lenet" for a model.factory preset, and had no field
    for data.path."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "tiny.toml"
    app = make_app(preset=example, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await wait_until(pilot, lambda: app.screen.query_one(ParamForm).ready, what="the form")
        model = app.screen.query_one("#f-model-name", Select)
        label = str(model.query_one("SelectCurrent Static").render())
        assert label.endswith("tiny_model.py:build (model.factory)") and model.disabled, label
        assert "lenet" not in label
        path = app.screen.query_one("#f-data-path", Input)
        assert path.placeholder == "text data: a file or a folder"
        text = tmp_path / "mine.txt"
        text.write_text("hello world " * 200)
        path.value = str(text)
        await pilot.pause()
        assert setup_of(app).query_one(ParamForm).values()["data.path"] == str(text)


async def test_start_runs_the_launcher_and_opens_the_run_screen(inventory, presets):
    launcher = ScriptedLauncher()
    app = make_app(preset="quickstart", launcher=launcher, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.click("#start")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        assert launcher.configs[0].strategy.name == "scratch"
        assert launcher.configs[0].devices.spec == "cpu*2"
        assert app.run_active
        # Leaving the test quits the app: the active run must be ended, not orphaned.
    handle = launcher.handles[0]
    assert handle.kill_calls + handle.stop_calls >= 1


async def test_launch_failure_is_shown_not_raised(inventory, presets):
    launcher = ScriptedLauncher(error=RuntimeError("cannot spawn: out of file handles"))
    app = make_app(preset="quickstart", launcher=launcher, inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause(0.2)
        await pilot.pause()
        assert isinstance(app.screen, SetupScreen)
        assert any("out of file handles" in n.message for n in app._notifications)
        assert not app.run_active


async def test_the_mouse_works_too(presets):
    app = make_app(inventory=fixed_inventory(gpus=2), presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        picker = app.screen.query_one(DevicePicker)
        await pilot.click("#device-table", offset=(8, 2))  # the row of GPU 1 (0 is the header)
        await pilot.pause()
        assert picker.spec == "cuda:1"
        await pilot.click("#device-table", offset=(8, 2))  # again: off, back to CPU
        await pilot.pause()
        assert picker.spec == "cpu"
        await pilot.click("#f-run-epochs")
        assert app.screen.focused is app.screen.query_one("#f-run-epochs")


async def test_the_form_covers_data_and_shows_defaults_as_what_they_mean(inventory, presets,
                                                                         tmp_path):
    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        form = app.screen.query_one(ParamForm)
        form.load(load_preset(presets[0]).replace(data={"train_size": 0}))
        await pilot.pause()
        train = app.screen.query_one("#f-data-train-size", Input)
        assert train.value == "" and train.placeholder == "all (synthetic: 12000)"
        root = app.screen.query_one("#f-data-root", Input)
        assert root.value == "" and root.placeholder.endswith("gputui/data")
        assert app.screen.query_one("#f-data-source", Select).value == "standard"
        # every placeholder fits in its box: nothing cut after "e.g."
        for box in app.screen.query(Input):
            if box.placeholder:
                assert len(box.placeholder) <= box.content_region.width, box.id
        root.value = str(tmp_path)
        app.screen.query_one("#f-data-source", Select).value = "test-split"
        await pilot.pause()
        cfg = setup_of(app).result.config
        assert (cfg.data.root, cfg.data.source, cfg.data.train_size) == (
            str(tmp_path), "test-split", 0)


async def test_the_mesh_is_set_from_the_form_and_says_what_these_devices_allow(inventory,
                                                                             presets):
    """Four CPU devices and the GPT preset: the 'mesh' option lists the meshes of 4 ranks the
    settings allow; the Mesh fields set the degrees (dp replicas 2: HSDP), a product that
    misses the ranks is the plan's one line in the summary, and Start waits for a valid one."""
    app = make_app(preset="gpt-tiny", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.screen.query_one("#cpu-count", Select).value = 4
        await pilot.pause()
        strategies = app.screen.query_one(StrategyPicker)
        assert strategies.meshes.startswith("on 4 ranks: dp_shard 4, dp_replicate 2 x "
                                            "dp_shard 2"), strategies.meshes
        options = app.screen.query_one("#strategy-list", OptionList)
        assert "on 4 ranks: " in str(options.get_option("mesh").prompt)
        options.focus()
        options.highlighted = [o.id for o in options._options].index("mesh")
        await pilot.press("enter")
        await pilot.pause()
        assert strategies.selected == "mesh"
        await pilot.click("#f-parallel-dp-replicate")
        await pilot.press("ctrl+a", "ctrl+k", "2")
        await pilot.pause()
        result = setup_of(app).result
        assert result.ok and result.config.parallel.dp_replicate == 2
        await pilot.click("#f-parallel-tp")
        await pilot.press("ctrl+a", "ctrl+k", "4")
        await pilot.pause()
        summary = str(app.screen.query_one("#summary").render())
        assert "pp x dp_replicate x tp = 8 does not divide the 4 ranks" in summary, summary
        assert app.screen.query_one("#start").disabled


async def test_f1_lists_the_apps_keys_before_the_focused_inputs(inventory, presets):
    """F1 with the focus in a text field: the app's and the screen's keys (Start run, Save
    preset, Quit ...) come first, the field's text-editing keys after them."""
    from gputui.tui.keys import AppFirstBindings

    app = make_app(preset="quickstart", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.click("#f-optim-lr")  # an Input: a dozen editing keys of its own
        await pilot.press("f1")
        await pilot.pause()
        table = app.screen.query_one(AppFirstBindings).render_bindings_table()
        descriptions = [str(cell) for cell in table.columns[1]._cells if str(cell)]
        start = next(i for i, d in enumerate(descriptions) if "Start run" in d)
        editing = next(i for i, d in enumerate(descriptions)
                       if any(w in d.lower() for w in ("delete", "cursor", "select all")))
        assert start < editing, descriptions
        assert "Start run" in descriptions[start] and start < 6, descriptions
