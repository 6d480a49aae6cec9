"""A preset's GPUs survive the app's start: the device inventory arrives after the first paint
(NVML through a fake, answering only when the test lets it), and the preset's choice is
applied then, and again when the machine's GPUs change; never a silent fall back to CPU."""

from __future__ import annotations

import threading

from scripted import wait_until
from textual.widgets import Button, DataTable

from gputui.tui.app import make_app
from gputui.tui.inventory import discover_inventory
from gputui.tui.screens.setup import SetupScreen
from gputui.tui.widgets.device_picker import DevicePicker

SIZE = (140, 44)


def gated_discovery(fake_gpus, counts: list[int]):
    """A discover function that waits for ``gate`` and then reads n GPUs, n taken from
    ``counts`` in turn (the last one repeats): a machine whose GPUs answer late, or change."""
    gate, calls = threading.Event(), []

    def discover():
        gate.wait(30)
        n = counts[min(len(calls), len(counts) - 1)]
        calls.append(n)
        fake_gpus(n)
        return discover_inventory()

    return discover, gate, calls


def preset(tmp_path, spec: str, fallback: str = "none"):
    path = tmp_path / "gpu.toml"
    path.write_text(f'[run]\nname = "gpu"\n[devices]\nspec = "{spec}"\nfallback = "{fallback}"\n',
                    encoding="utf-8")
    return path


def ticked(app) -> list[str]:
    table = app.screen.query_one("#device-table", DataTable)
    return [str(k.value) for k in table.rows if table.get_row(k)[0] == "✔"]


async def test_a_gpu_preset_waits_for_discovery_then_keeps_its_gpu(fake_gpus, tmp_path):
    discover, gate, _ = gated_discovery(fake_gpus, [1])
    app = make_app(preset(tmp_path, "0"), discover=discover, presets=[])
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SetupScreen)
        picker = screen.query_one(DevicePicker)
        # first paint, discovery not back yet: no CPU device chosen in the preset's place
        assert picker.waiting and picker.spec == "0"
        assert ticked(app) == []
        assert "waiting for GPU discovery" in str(screen.query_one("#summary").render())
        assert screen.query_one("#start", Button).disabled
        assert not app._notifications  # no warning before discovery has said anything
        gate.set()
        await wait_until(pilot, lambda: not picker.waiting, what="the discovery")
        await pilot.pause()
        assert picker.spec == "cuda:0" and ticked(app) == ["cuda:0"]
        assert str(screen.query_one("#summary").render()).startswith("Ready: single on cuda:0")
        assert not screen.query_one("#start", Button).disabled
        assert not app._notifications


async def test_fewer_gpus_follow_the_fallback_then_the_gpus_when_they_come(fake_gpus, tmp_path):
    counts = [1]  # every reading (the screen reads again every few seconds) until changed
    discover, gate, calls = gated_discovery(fake_gpus, counts)
    gate.set()
    app = make_app(preset(tmp_path, "2", "cpu"), discover=discover, presets=[])
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = app.screen
        picker = screen.query_one(DevicePicker)
        await wait_until(pilot, lambda: calls and not picker.waiting, what="the discovery")
        await pilot.pause()
        # one GPU for a preset asking two: its fallback, said in one line
        assert picker.spec == "cpu*2" and ticked(app) == ["cpu:0", "cpu:1"]
        messages = [n.message for n in app._notifications]
        assert any("running on 2 CPU virtual device(s) instead" in m for m in messages)
        counts[:] = [2]  # the machine now shows two GPUs
        screen.refresh_inventory()  # the next reading
        await wait_until(pilot, lambda: picker.spec == "0,1", what="the GPUs applied")
        await pilot.pause()
        assert ticked(app) == ["cuda:0", "cuda:1"]


async def test_a_choice_by_hand_is_kept_when_the_gpus_change(fake_gpus, tmp_path):
    discover, gate, calls = gated_discovery(fake_gpus, [2, 3])
    gate.set()
    app = make_app(preset(tmp_path, "2"), discover=discover, presets=[])
    async with app.run_test(size=SIZE) as pilot:
        picker = app.screen.query_one(DevicePicker)
        await wait_until(pilot, lambda: picker.spec == "0,1", what="the preset's GPUs")
        table = app.screen.query_one("#device-table", DataTable)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")  # GPU 1 off: the user's choice from now on
        await pilot.pause()
        assert picker.spec == "cuda:0"
        app.screen.refresh_inventory()
        await wait_until(pilot, lambda: "cuda:2" in [str(k.value) for k in table.rows],
                         what="a third GPU listed")
        assert picker.spec == "cuda:0"
