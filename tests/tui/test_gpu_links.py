"""The device picker names the links between the chosen GPUs (NVLink, or the PCIe path NVML
reports) and warns on a pair without a fast link; discovery goes through the fake NVML."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from gputui.tui.app import make_app
from gputui.tui.inventory import discover_inventory, links_note
from gputui.tui.widgets.device_picker import DevicePicker


def three_gpus(fake_gpus):
    """cuda:0 and cuda:1 joined by two NVLinks; cuda:2 across the CPU sockets from both."""
    mod = fake_gpus(3)
    a, b, c = mod.gpus
    a.nvlinks, b.nvlinks = [b.bus_id, b.bus_id, ""], [a.bus_id, a.bus_id]
    for x, y, level in ((a, b, 10), (a, c, 50), (b, c, 50)):
        x.topology[y.bus_id] = y.topology[x.bus_id] = level
    return mod


def test_discovery_finds_the_links_and_the_note_warns_on_a_slow_pair(fake_gpus):
    three_gpus(fake_gpus)
    links = discover_inventory().links
    assert links == {(0, 1): (2, "PCIe switch"), (0, 2): (0, "across CPU sockets"),
                     (1, 2): (0, "across CPU sockets")}
    assert links_note({0, 1}, links) == "cuda:0–cuda:1: NVLink ×2"
    assert links_note({0}, links) == ""
    note = links_note({0, 2}, links)
    assert note.startswith("⚠ cuda:0–cuda:2: no NVLink, across CPU sockets")


async def test_the_picker_shows_the_links_of_the_chosen_gpus(fake_gpus):
    three_gpus(fake_gpus)
    app = make_app(inventory=discover_inventory(), presets=[])
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        picker = app.screen.query_one(DevicePicker)
        table = picker.query_one("#device-table", DataTable)
        for row in (0, 2):  # cuda:0 and cuda:2, by hand
            table.focus()
            table.move_cursor(row=row)
            await pilot.press("space")
            await pilot.pause()
        assert picker.spec == "0,2" and picker.has_class("-links")
        note = str(picker.query_one("#link-note", Static).render())
        assert "⚠ cuda:0–cuda:2: no NVLink" in note
        await pilot.press("space")  # cuda:2 off again: one GPU, no pair
        await pilot.pause()
        assert picker.spec == "cuda:0" and not picker.has_class("-links")
