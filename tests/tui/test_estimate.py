"""An estimate before Start for runs expected to take more than a minute, from this
machine's earlier runs of the same work (issue 26)."""

from __future__ import annotations

import sys
from pathlib import Path

from scripted import wait_until
from textual.widgets import Static

from gputui.core.config import RunConfig
from gputui.runs.history import load_rows
from gputui.tui.app import make_app
from gputui.tui.estimate import duration_words, estimate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from run_records import write_record  # noqa: E402

SIZE = (140, 44)


def runs_of_the_same_work(runs: Path) -> None:
    """Two finished single-device lenet runs of 1,000 examples at 1,000 and 500 samples/s
    (1 and 2 s an epoch), and others that are not the same work."""
    write_record(runs, "20260101-100000-exp-aaaa", sps=1000)
    write_record(runs, "20260101-110000-exp-bbbb", sps=500)
    write_record(runs, "20260101-120000-exp-cccc", "scratch", 2, sps=100)  # other strategy
    write_record(runs, "20260101-130000-exp-dddd", sps=10, batch=128)  # other batch
    write_record(runs, "20260101-140000-exp-eeee", sps=10, status="failed")


def config(epochs: int) -> RunConfig:
    return RunConfig().replace(run={"epochs": epochs}, data={"train_size": 1000})


def test_estimate_from_the_same_work_only(tmp_path):
    runs_of_the_same_work(tmp_path)
    rows = load_rows(tmp_path)
    found = estimate(config(100), rows, 1)
    assert found is not None and found.runs == 2
    # the median epoch (1.5 s) x 100 epochs, plus the runs' start-up
    init = rows[-1].init_s or 0.0
    assert abs(found.seconds - (150 + init)) < 1e-6
    assert found.text() == "about 3 min on this machine (from 2 earlier runs)"
    assert estimate(config(2), rows, 1) is None  # 3 s: starts without a word
    assert estimate(config(100), rows, 4) is None  # never run on 4 devices
    assert [duration_words(s) for s in (61, 250, 3600, 4800)] == [
        "1 min", "4 min", "1 h", "1 h 20 min"]


async def test_the_ready_line_says_how_long(tmp_path, inventory, presets):
    runs_of_the_same_work(tmp_path / "runs")
    app = make_app(runs_dir=tmp_path / "runs", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        screen.query_one("#f-run-epochs").value = "100"
        screen.query_one("#f-data-train-size").value = "1000"
        summary = screen.query_one("#summary", Static)
        await wait_until(pilot, lambda: "earlier runs" in str(summary.render()),
                         what="the estimate in the ready line")
        assert "about 3 min on this machine (from 2 earlier runs)" in str(summary.render())


def keep_step(cfg: RunConfig, seconds: float) -> None:
    """What `gputui predict` keeps after measuring ``cfg``'s step on one device (the CPU,
    every core): its steady step time, in this machine's cache file."""
    from gputui.runs.predict.cache import Cache, compute_key, cores

    Cache().put(compute_key(cfg, cfg.optim.batch_size, cores(), 1, "cpu"),
                {"step_time_s": seconds, "params": 61706})


async def ready_line(app, pilot) -> str:
    screen = app.screen
    await wait_until(pilot, lambda: screen.estimate_settled, what="the estimate's sources")
    await pilot.pause()
    return str(screen.query_one("#summary", Static).render())


async def test_a_first_run_says_why_there_is_no_estimate_then_uses_a_measured_step(
        tmp_path, inventory, presets, monkeypatch):
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))  # nothing measured yet
    app = make_app(runs_dir=tmp_path / "runs", inventory=inventory, presets=presets)
    async with app.run_test(size=SIZE) as pilot:
        line = await ready_line(app, pilot)
        assert line.endswith(" · time unknown: first run of this work here"), line
        assert "gputui predict PRESET" in str(app.screen.query_one("#summary").tooltip)
        cfg = app.screen.result.config
        assert (cfg.strategy.name, cfg.devices.spec, cfg.data.train_size) == ("single", "cpu",
                                                                              12000)
        # measured at 0.5 s a step: 46 steps an epoch of 12,000 examples in batches of 256
        keep_step(cfg, 0.5)
        app.screen.query_one("#f-run-epochs").value = "10"  # 230 s of steps
        await pilot.pause()
        line = await ready_line(app, pilot)
        assert line.endswith(" · about 4 min of training steps on this machine (predicted "
                             "from its measured steps)"), line
        app.screen.query_one("#f-run-epochs").value = "2"  # 46 s: starts without a word
        await pilot.pause()
        line = await ready_line(app, pilot)
        assert line.endswith("lr 0.1"), line
        assert app.screen.query_one("#summary").tooltip is None


def test_a_gpu_without_a_known_name_is_never_given_the_cpus_steps(tmp_path, monkeypatch):
    """The CPU's measured step is no estimate for a GPU run: with a GPU chosen whose name the
    last discovery did not give, the answer is 'time unknown', even where the CPU's is kept."""
    from gputui.tui.estimate import FIRST_RUN, UNKNOWN_GPU, Estimate, predicted

    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    cfg = RunConfig().replace(strategy={"name": "single"}, data={"name": "synthetic"},
                              run={"epochs": 10})
    keep_step(cfg, 0.5)
    assert isinstance(predicted(cfg, 1, ""), Estimate)  # the CPU's own run: its steps
    assert predicted(cfg, 1, UNKNOWN_GPU) == FIRST_RUN
