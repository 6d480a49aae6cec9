"""Typing into the set-up form asks the hardware nothing and reads no file on the UI thread:
the rules are checked against the devices of the app's last discovery (NVML through a fake
that counts its calls), the files a config names are read off that thread, and at Start."""

from __future__ import annotations

import threading

from scripted import wait_until
from textual.widgets import DataTable

from gputui.hw.discovery import discover_gpus
from gputui.tui import form
from gputui.tui.app import make_app
from gputui.tui.inventory import Inventory, device_row
from gputui.tui.widgets.device_picker import DevicePicker

SIZE = (140, 44)


def discovered() -> Inventory:
    """The inventory the app's discovery makes of the fake's GPUs (without psutil's wait)."""
    gpus, reason = discover_gpus()
    return Inventory(tuple(device_row(g) for g in gpus), reason, cores=2, gpu_infos=tuple(gpus))


def summary(app) -> str:
    return str(app.screen.query_one("#summary").render())


async def test_typing_with_a_gpu_chosen_makes_no_nvml_call(fake_gpus, launcher):
    fake = fake_gpus(2)
    app = make_app(inventory=discovered(), presets=[], launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.screen.query_one("#device-table", DataTable).focus()
        await pilot.press("down", "enter")  # GPU 1, by hand
        await pilot.pause()
        assert app.screen.query_one(DevicePicker).spec == "cuda:1"
        assert summary(app).startswith("Ready: single on cuda:1")
        asked = len(fake.calls)
        await pilot.click("#f-optim-lr")
        await pilot.press("ctrl+a", "ctrl+k", *"0.05")
        await pilot.click("#f-optim-micro-batches")
        await pilot.press("ctrl+a", "ctrl+k", *"999")  # more micro-batches than examples
        await pilot.pause()
        assert summary(app).startswith("✗ form: optim.batch_size (256) is smaller than "
                                       "optim.micro_batches (999)")
        await pilot.press("ctrl+a", "ctrl+k", "2")
        await pilot.pause()
        assert summary(app).startswith("Ready: single on cuda:1")
        assert fake.calls[asked:] == []  # every check ran against the last discovery


async def test_the_files_a_config_names_are_read_off_the_ui_thread(tmp_path, inventory,
                                                                   launcher, monkeypatch):
    on_ui: list[bool] = []  # per disk check: did it run on the UI thread?
    real = form.files_problem

    def watched(*args, **kwargs):
        on_ui.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr("gputui.tui.screens.setup.files_problem", watched)
    preset = tmp_path / "mnist.toml"
    preset.write_text(f'[data]\nname = "mnist"\nroot = "{tmp_path}"\n', encoding="utf-8")
    app = make_app(preset=str(preset), inventory=inventory, presets=[preset], launcher=launcher)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: "mnist: missing" in summary(app), what="the disk's answer")
        assert on_ui == [False]
        await pilot.click("#f-optim-lr")
        await pilot.press("ctrl+a", "ctrl+k", *"0.05")  # the files do not depend on it
        await pilot.pause()
        assert on_ui == [False]
        await pilot.click("#f-data-root")
        await pilot.press("end", *"/zz9")  # they depend on this: checked again, off-thread
        await wait_until(pilot, lambda: "zz9" in summary(app), what="the new root's answer")
        assert "mnist: missing train-images-idx3-ubyte.gz" in summary(app)
        assert app.screen.query_one("#start").disabled
        assert len(on_ui) >= 2 and not any(on_ui)
        await pilot.press("ctrl+r")  # Start reads the disk once more, whatever it said
        await pilot.pause()
        assert on_ui[-1] and on_ui.count(True) == 1
        assert any("mnist: missing" in n.message for n in app._notifications)
        assert launcher.configs == []
