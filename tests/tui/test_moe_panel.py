"""A mixture-of-experts run on the run screen: under ep each device panel says the tokens its
rank's experts took against the mean (the load imbalance), its training memory the experts it
holds, and the log what the FLOPs count (the active parameters beside the total)."""

from __future__ import annotations

from dataclasses import replace

from scripted import FakeHandle, run_events

from gputui.core.events import DeviceSample, FlopsInfo, MemoryReport, StepMetrics
from gputui.tui.app import make_app
from gputui.tui.screens.run import RunScreen
from gputui.tui.widgets.device_panel import DevicePanel
from gputui.tui.widgets.hw_figures import TrainMemory
from gputui.tui.widgets.run_log import RunLog

MOE = {"routed": [110, 162, 146, 94], "kept": [100, 128, 128, 94], "dropped": 62,
       "forwards": 5, "layers": 2, "ep": 2, "experts": 4, "top_k": 2}


def moe_events() -> list:
    out = []
    for e in run_events(devices=2, epochs=1, steps_per_epoch=10, log_every=5):
        if isinstance(e, StepMetrics):
            e = replace(e, moe=MOE, per_device=tuple(replace(r, rank=i) for i, r in
                                                     enumerate(e.per_device)))
        elif isinstance(e, MemoryReport):
            e = replace(e, per_device=tuple(replace(r, experts=2 * 2**20) for r in e.per_device))
        elif isinstance(e, FlopsInfo):
            e = replace(e, params_total=300_000, params_active=200_000)
        if not isinstance(e, DeviceSample):
            out.append(e)
    return out


async def test_each_rank_shows_its_experts_tokens_and_memory(inventory, presets):
    app = make_app(inventory=inventory, presets=presets)
    async with app.run_test(size=(140, 44)) as pilot:
        screen = RunScreen(FakeHandle([]))
        await app.push_screen(screen)
        await pilot.pause()
        screen.apply_events(moe_events())
        await pilot.pause()
        panels = {p.device: p for p in screen.query(DevicePanel)}
        assert "experts 0-1: 228 tokens kept (1.01x mean)" in panels["cpu:0"].comm_text
        assert "experts 2-3: 222 tokens kept (0.99x mean)" in panels["cpu:1"].comm_text
        memory = str(panels["cpu:1"].query_one(TrainMemory).render())
        assert "(experts 2.0 MiB)" in memory
        log = "\n".join(screen.query_one(RunLog).plain)
        assert "over the 200,000 active parameters (of 300,000" in log
