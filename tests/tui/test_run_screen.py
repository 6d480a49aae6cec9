"""The run screen fed a scripted event stream: every panel shows what the events say."""

from __future__ import annotations

import dataclasses

from scripted import GIB, T0, FakeHandle, ScriptedLauncher, fixed_inventory, run_events, wait_until

from gputui.core.config import RunConfig
from gputui.core.events import DeviceSample, StepMetrics
from gputui.tui.app import make_app
from gputui.tui.messages import DeviceSamples, RunEventBatch
from gputui.tui.screens.dialogs import ChoiceDialog
from gputui.tui.screens.run import RunScreen
from gputui.tui.screens.setup import SetupScreen
from gputui.tui.widgets.device_panel import DevicePanel, Meter
from gputui.tui.widgets.epoch_table import EpochTable
from gputui.tui.widgets.history_row import HistoryRow
from gputui.tui.widgets.plots import AccuracyPlot, LossPlot, ThroughputPlot
from gputui.tui.widgets.run_log import RunLog

SIZE = (200, 50)  # every panel shows (the compact layouts: test_snapshots, test_run_figures)


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


async def open_run(pilot, app) -> RunScreen:
    """Start the set-up as loaded and wait for the run screen."""
    await pilot.pause()
    await pilot.press("ctrl+r")
    await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
    return app.screen


def scripted_app(events, presets, **handle_kw):
    launcher = ScriptedLauncher(lambda cfg: FakeHandle(list(events), **handle_kw))
    app = make_app(preset="quickstart", launcher=launcher, inventory=fixed_inventory(),
                   presets=presets)
    return app, launcher


async def test_a_finished_run_fills_every_panel(presets):
    gpu = DeviceSample(device="cuda:0", name="NVIDIA A100", util=97.0, mem_used=30 * GIB,
                       mem_total=40 * GIB, temp_c=64.0, power_w=210.0, power_limit_w=400.0,
                       t=T0 + 3)
    events = run_events(epochs=3, steps_per_epoch=20, log_every=5)
    events.insert(5, gpu)
    app, _ = scripted_app(events, presets, chunk=4)  # a few events per poll, as in a real run
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        assert screen.state == "finished" and not screen.display_errors
        steps = [e for e in events if isinstance(e, StepMetrics)]
        # Loss and samples/s: one point per logged step, the latest value exact.
        loss, thr = screen.query_one(LossPlot), screen.query_one(ThroughputPlot)
        assert [p[0] for p in loss.points] == [e.global_step for e in steps]
        assert loss.last_y == steps[-1].loss and thr.last_y == steps[-1].samples_per_s
        assert screen.query_one(AccuracyPlot).points == [(1.0, 60.0), (2.0, 70.0),
                                                          (3.0, 80.0)]
        # Epochs: time beside test accuracy.
        table = screen.query_one(EpochTable)
        assert table.row_count == 3
        assert list(table.get_row("2")) == ["2/3", "70.00%", "2.0 s", "0.5000", "0.4 s", "6,000"]
        # Status strip: progress, ETA, init time, throughput.
        assert text(screen, "#epoch-label") == "epoch 3/3 · step 60/60"
        assert text(screen, "#eta-label") == "ETA 0:00 (whole run)"
        meta = text(screen, "#status-meta")
        assert meta.startswith("init 2.5 s · samples/s 5,600 · step 60")
        assert "finished" in text(screen, "#state-badge")
        # CPU virtual devices: a panel each, bars from the rank's CPU % and RSS, a history.
        cpu1 = screen.query_one("#dev-cpu-1", DevicePanel)
        last1 = [e for e in events if isinstance(e, DeviceSample) and e.device == "cpu:1"]
        assert cpu1.query_one(".util-meter", Meter).value_text == f"{last1[-1].cpu_percent:5.1f}%"
        assert cpu1.query_one(".mem-meter", Meter).value_text == "1.0 GiB/8.0 GiB"
        history = list(cpu1.query_one(".util-spark", HistoryRow).data)
        # Coalescing may drop stale samples, but never reorders or invents one: the history
        # is an in-order subsequence of what was sent, and ends with the latest.
        sent = iter(e.cpu_percent for e in last1)
        assert len(history) > 1 and all(value in sent for value in history), (history, last1)
        assert history[-1] == last1[-1].cpu_percent
        assert text(cpu1, ".dev-extra") == "pid 4243"  # a CPU process: no temp or power
        # The run's MFU under the utilization, the device's training memory under its own.
        assert cpu1.query_one(".mfu-meter", Meter).value_text == " 31.0%"
        assert text(cpu1, ".train-mem") == ("params 241 KiB · grads 241 KiB\noptim 241 KiB · "
                                            "activ. 16.8 MiB")
        # Where the last metered step went: a stacked bar as wide as the panel, and a legend.
        parts = text(cpu1, ".dev-breakdown")
        bar_line, legend = parts.split("\n", 1)
        assert bar_line.startswith("step 100.0 ms ")
        assert len(bar_line) == cpu1.query_one(".dev-breakdown").content_region.width
        assert legend.split() == ["compute", "40%", "comm", "10%", "optim", "8%", "data", "2%",
                                  "wait", "40%"]
        assert "wait 38%" in text(screen.query_one("#dev-cpu-0", DevicePanel), ".dev-breakdown")
        # A GPU reading: utilization, memory, temperature and power with its limit.
        gpu_panel = screen.query_one("#dev-cuda-0", DevicePanel)
        assert gpu_panel.query_one(".util-meter", Meter).fraction == 0.97
        assert gpu_panel.query_one(".mem-meter", Meter).value_text == "30.0 GiB/40.0 GiB"
        assert text(gpu_panel, ".dev-extra") == "temp 64 °C · power 210 W / 400 W"
        # The log: the run's notes, its own lines and warnings, the epochs and the end.
        log = screen.query_one(RunLog).plain
        assert "warning CPU virtual devices share 2 cores" in log
        assert "info torch 2.14.1, 2 threads" in log
        assert "warning DataParallel has no CPU mode" in log
        assert ("info 3.39 GFLOP per step (forward and backward); peak 110.0 GFLOP/s fp32 for "
                "2 devices (a CPU, measured matmul): the panels' mfu is the share reached") in log
        assert any(line.startswith("info epoch 3/3: 2.0 s, train loss 0.3333, test acc 80.00%")
                   for line in log)
        assert log[-1] == f"info run finished in {events[-1].seconds:.1f} s"


async def test_a_failed_run_says_why_in_the_app(presets):
    app, _ = scripted_app(run_events(epochs=1, end="failed"), presets)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended)
        await pilot.pause()
        assert screen.state == "failed"
        assert "failed" in text(screen, "#state-badge")
        reason = "dataset 'mnist' not found in /nowhere; set data.root"
        lines = screen.query_one(RunLog).plain
        assert f"error run failed: {reason}" in lines
        # the traceback stays in the record; the log pane says where, and shows none of it
        shown = "\n".join(lines)
        assert "Traceback" not in shown and "info the traceback is in the record (" in shown
        assert any(reason in n.message for n in app._notifications)
        # Escape goes back once the run has ended; the app still works.
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SetupScreen)


async def test_stop_is_graceful_and_kill_asks_first(presets):
    app, launcher = scripted_app(run_events(epochs=1), presets, hold_terminal=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.events_handled >= 9)
        assert screen.state == "running"
        # Kill asks first; cancelling leaves the run alone.
        await pilot.press("k")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen and launcher.handles[0].kill_calls == 0
        # Leaving asks too; "Stay" keeps watching.
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
        await pilot.click("#stay")
        await pilot.pause()
        assert app.screen is screen
        # Stop: the handle is asked once, the screen shows "stopped" when the run says so.
        await pilot.press("s")
        await wait_until(pilot, lambda: screen.ended, what="the stopped run")
        assert launcher.handles[0].stop_calls == 1 and screen.state == "stopped"
        assert "run stopped: stopped by user" in "\n".join(screen.query_one(RunLog).plain)
        assert text(screen, "#eta-label") == "ETA --:-- (whole run)"
        assert screen.check_action("stop", ()) is False  # no longer offered in the footer


async def test_kill_from_the_dialog(presets):
    app, launcher = scripted_app(run_events(epochs=1), presets, hold_terminal=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await pilot.press("k")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
        await pilot.press("enter")  # "Kill now" has the focus
        await wait_until(pilot, lambda: screen.ended, what="the killed run")
        assert launcher.handles[0].kill_calls == 1
        assert screen.state == "killed" and "killed" in text(screen, "#state-badge")
        assert "run killed: killed by user" in "\n".join(screen.query_one(RunLog).plain)
        assert text(screen, "#eta-label") == "ETA --:-- (whole run)"  # not 0:00: it never got there


async def test_quitting_with_an_active_run_stops_it_first(presets):
    app, launcher = scripted_app(run_events(epochs=1), presets, hold_terminal=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
        assert app.is_running  # asked, not gone
        await pilot.click("#stop")
        await wait_until(pilot, lambda: not app.is_running, what="the app to exit")
    handle = launcher.handles[0]
    assert handle.stop_calls == 1 and handle.kill_calls == 0
    assert screen.state == "stopped"


async def test_the_app_follows_the_run_to_its_end_after_its_screen_is_gone(presets):
    # No key closes the run screen of an active run, but the run's lifecycle must not
    # depend on it: the app pumps the run, and quitting waits for the run's real end.
    app, launcher = scripted_app(run_events(epochs=1), presets, hold_terminal=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.events_handled >= 9)
        await app.pop_screen()
        await pilot.pause()
        assert isinstance(app.screen, SetupScreen) and app.run_active
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
        await pilot.click("#stop")
        await wait_until(pilot, lambda: not app.is_running, what="the app to exit")
    handle = launcher.handles[0]
    assert handle.stop_calls == 1 and handle.kill_calls == 0
    assert app.run_control is not None and app.run_control.ended


class Burst(FakeHandle):
    """Delivers ``n`` steps and samples in every poll, as fast as the pump asks."""

    def __init__(self, n: int) -> None:
        super().__init__([])
        self.n, self.sent, self.next_step = n, 0, 1

    def poll(self, timeout=0.0, max_events=10_000):
        if self._stopping:
            self._done = True
            out, self._events = self._events, []
            return out
        out = []
        for _ in range(self.n // 2):
            i = self.next_step
            self.next_step += 1
            out.append(StepMetrics(epoch=1, step=i, global_step=i, steps_per_epoch=10**9,
                                   loss=1.0 / i, samples_per_s=float(i), step_time_s=0.001,
                                   lr=0.1, t=T0 + i * 1e-3))
            self._sampled.append(DeviceSample(device=f"cpu:{i % 2}", cpu_percent=float(i % 100),
                                              t=T0 + i * 1e-3))
        self.sent += len(out) * 2
        return out


async def test_a_burst_of_events_never_queues_without_bound(presets):
    """Thousands of events per poll: the UI takes them in a few batches and stays responsive."""
    handle = Burst(10_000)
    launcher = ScriptedLauncher(lambda cfg: handle)
    app = make_app(preset="quickstart", launcher=launcher, inventory=fixed_inventory(),
                   presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: handle.sent >= 100_000, timeout=60,
                         what="100,000 events")
        # Keys are still handled while the burst goes on.
        await pilot.press("l")
        await pilot.pause()
        assert screen.query_one(RunLog).has_focus
        # Nothing piles up: the pump keeps one event batch in flight and one samples message
        # (a lost one is re-posted after a grace period). Textual's own messages (timers,
        # repaints) also sit in this queue and grow with machine load, so they are not counted.
        # (test_pump.py proves the one-batch-in-flight rule deterministically.)
        from_pump = [m for m in list(screen._message_queue.values)
                     if isinstance(m, (RunEventBatch, DeviceSamples))]
        assert len(from_pump) <= 3, from_pump
        assert screen.batches_handled < handle.sent / 1000  # coalesced into large batches
        assert screen.query_one(LossPlot).points[-1][0] > 25_000
        assert not screen.display_errors
        await pilot.press("s")
        await wait_until(pilot, lambda: screen.ended, timeout=30)


async def test_devices_driven_by_one_process_say_so(presets):
    # scratch on CPU virtual devices: one process, so one pid and the same figures everywhere
    events = [dataclasses.replace(e, pid=4242) if isinstance(e, DeviceSample) else e
              for e in run_events(epochs=1)]
    app, _ = scripted_app(events, presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        cpu0 = screen.query_one("#dev-cpu-0", DevicePanel)
        cpu1 = screen.query_one("#dev-cpu-1", DevicePanel)
        assert text(cpu0, ".dev-extra") == "pid 4242 · one process with cpu:1"
        assert text(cpu1, ".dev-extra") == "pid 4242 · one process with cpu:0"
        assert cpu0.query_one(".dev-extra").content_region.width >= len(text(cpu0, ".dev-extra"))


async def test_a_ddp_rank_shows_its_allreduce_bandwidth_against_the_kept_peak(
        presets, tmp_path, monkeypatch):
    from gputui.core.events import RunStarted
    from gputui.runs.predict import comm_peak

    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path))
    comm_peak.keep({"n": 2, "backend": "gloo", "devices": ["cpu:0", "cpu:1"],
                    "torch": [{"size": 4096, "algbw_gbps": 0.2, "busbw_gbps": 0.2},
                              {"size": 2**20, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]}, "cpu")
    events = []
    for ev in run_events(epochs=1, steps_per_epoch=10, log_every=5):
        if isinstance(ev, RunStarted):
            ev = dataclasses.replace(ev, world_size=2, strategy="ddp")
        elif isinstance(ev, StepMetrics):  # rank 0 at 0.5 GB/s, rank 1 at 0.25
            rows = tuple(dataclasses.replace(r, comm_bytes=10**6, comm_gbps=0.5 / (1 + i))
                         for i, r in enumerate(ev.per_device))
            ev = dataclasses.replace(ev, per_device=rows, comm_gbps=0.375)
        events.append(ev)
    app, _ = scripted_app(events, presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        assert not screen.display_errors
        shown = [text(screen.query_one(f"#dev-cpu-{i}", DevicePanel), ".dev-breakdown")
                 for i in (0, 1)]
        assert shown[0].endswith("allreduce 0.50 GB/s, 50% of bench-comm's 1.00")
        assert shown[1].endswith("allreduce 0.25 GB/s, 25% of bench-comm's 1.00")


def lm_events() -> list:
    """The scripted run as a language model's: its score a validation loss, tokens/s."""
    from gputui.core.events import EpochEnd, InitDone

    out = []
    for ev in run_events(epochs=2, steps_per_epoch=20, log_every=5):
        if isinstance(ev, InitDone):
            ev = dataclasses.replace(ev, task="lm", tokens_per_sample=64, baseline_loss=3.1)
        elif isinstance(ev, StepMetrics):
            ev = dataclasses.replace(ev, tokens_per_s=ev.samples_per_s * 64)
        elif isinstance(ev, EpochEnd):
            ev = dataclasses.replace(ev, task="lm", test_acc=float("nan"),
                                     val_loss=3.0 - 0.5 * ev.epoch, tokens_per_s=6000.0 * 64)
        out.append(ev)
    return out


async def test_a_language_models_run_shows_loss_perplexity_and_tokens(presets):
    events = lm_events()
    app, _ = scripted_app(events, presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        assert screen.state == "finished" and not screen.display_errors
        score, thr = screen.query_one(AccuracyPlot), screen.query_one(ThroughputPlot)
        assert score.title == "Val. loss per epoch (nats/token; unigram 3.10)"
        assert score.points == [(1.0, 2.5), (2.0, 2.0)] and score.ylim is None
        steps = [e for e in events if isinstance(e, StepMetrics)]
        assert thr.title == "Tokens/s" and thr.last_y == steps[-1].tokens_per_s
        table = screen.query_one(EpochTable)
        assert table.labels[1] == "val loss (ppl)" and table.labels[5] == "tokens/s"
        row = list(table.get_row("2"))
        assert (row[1], row[5]) == ("loss 2.0000 (ppl 7.39)", "384,000")
        assert "tokens/s" in text(screen, "#status-meta")
        log = screen.query_one(RunLog).plain
        assert any("train loss 0.5000, val loss 2.0000 / ppl 7.39" in line for line in log)


async def test_a_scheduled_lr_shows_in_the_status_strip(presets):
    """A run whose lr follows a schedule shows the last logged step's lr; a constant lr
    (every other test here) shows none."""
    events = run_events(epochs=1, steps_per_epoch=10, log_every=5)
    first = events[0]
    events[0] = dataclasses.replace(first, config=first.config.replace(optim={
        "schedule": "cosine", "warmup_steps": 2}))
    events = [dataclasses.replace(e, lr=0.1 / e.global_step) if isinstance(e, StepMetrics)
              else e for e in events]
    app, _ = scripted_app(events, presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        assert "· step 10 · lr 0.01 · elapsed" in text(screen, "#status-meta")


async def test_the_slowest_ranks_panel_names_it_its_phase_and_the_others_wait(presets):
    from gputui.core.breakdown import make
    from gputui.core.events import RunStarted

    def rank(i: int, backward: float, exposed: float):
        bd = make(span_s=0.3, data_s=0.0, compute_s=0.02 + backward, optimizer_s=0.01,
                  comm_exposed_s=exposed)
        return dict(rank=i, breakdown=bd, forward_s=0.02, backward_s=backward)

    events = []
    for ev in run_events(epochs=1, steps_per_epoch=10, log_every=5):
        if isinstance(ev, RunStarted):
            ev = dataclasses.replace(ev, world_size=2, strategy="ddp")
        elif isinstance(ev, StepMetrics):  # rank 1 is 200 ms slower in backward
            rows = tuple(dataclasses.replace(r, **rank(i, (0.05, 0.25)[i], (0.21, 0.01)[i]))
                         for i, r in enumerate(ev.per_device))
            ev = dataclasses.replace(ev, per_device=rows)
        events.append(ev)
    app, _ = scripted_app(events, presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        shown = [text(screen.query_one(f"#dev-cpu-{i}", DevicePanel), ".dev-breakdown")
                 for i in (0, 1)]
        assert "straggler" not in shown[0]
        assert "straggler: rank 1 (cpu:1), in backward: +200.0 ms" in shown[1].replace("\n", " ")
        assert "waited 200.0 ms" in shown[1].replace("\n", " ")


async def test_a_mesh_run_shows_what_each_rank_holds(presets):
    """A run of strategy 'mesh' (2 replicas of 2 shards x tp ... here dp_replicate 2 x tp 2 on 4
    ranks): each device panel's title says its rank's place, the log the mesh once."""
    events = run_events(devices=4, epochs=1)
    cfg = RunConfig().replace(
        run={"epochs": 1, "name": "quickstart"}, strategy={"name": "mesh"},
        model={"name": "gpt"}, data={"name": "pystdlib"},
        parallel={"dp_replicate": 2, "dp_shard": 1, "tp": 2, "zero": 3, "ac": "full"})
    events[0] = dataclasses.replace(events[0], config=cfg, strategy="mesh", world_size=4)
    app, _ = scripted_app(events, presets)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_run(pilot, app)
        await wait_until(pilot, lambda: screen.ended, what="the end of the run")
        await pilot.pause()
        titles = [str(p.border_title) for p in screen.query(DevicePanel)]
        assert titles == ["cpu:0 · dp 0 · tp 0", "cpu:1 · dp 0 · tp 1",
                          "cpu:2 · dp 1 · tp 0", "cpu:3 · dp 1 · tp 1"], titles
        lines = [str(line) for line in screen.query_one(RunLog).lines]
        assert any("mesh dp_replicate 2 x tp 2 (full activation checkpointing)" in line
                   for line in lines), lines
