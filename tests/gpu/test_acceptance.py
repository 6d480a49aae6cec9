"""The GPU acceptance suite: what a user meets first on a machine with one or more NVIDIA GPUs,
each against the real CUDA, NCCL and NVML (``pytest -m gpu``; skipped without CUDA).

One GPU is enough for everything here: every strategy that fits one GPU in fp32, bf16 and
fp16, headless, learning far above chance; ddp and fsdp over NCCL; telemetry rows that read
the GPU; checkpoint and resume; the app from a GPU preset to a finished run on cuda:0. The
multi-GPU paths (2+ GPUs) are in tests/unit/test_dp_mp_gpu.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gputui.core.runstore import read_events  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs CUDA (torch sees no GPU)")]
GPUTUI = [sys.executable, "-m", "gputui"]
# quickstart: LeNet on the embedded synthetic digits, 3 epochs (about 95 % on the CPU)
SMALL = ["--epochs", "3", "--set", "telemetry.interval_s=0.25"]


def run(tmp_path: Path, *args: str, timeout: int = 300) -> tuple[dict, Path]:
    """``gputui run quickstart ARGS --json`` on GPU 0; the summary and the run's folder."""
    proc = subprocess.run([*GPUTUI, "run", "quickstart", "--devices", "0", *SMALL, *args,
                           "--json", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    return summary, Path(summary["run_dir"])


def accuracy(summary: dict) -> float:
    """The test accuracy as a fraction, whichever way the summary states it."""
    acc = summary["test_acc"]
    return acc / 100 if acc > 1 else acc


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("strategy", ["single", "scratch", "dp", "ddp", "fsdp"])
def test_every_strategy_learns_on_one_gpu(tmp_path, strategy, precision):
    summary, run_dir = run(tmp_path, "--strategy", strategy, "--set",
                           f"run.precision={precision}")
    assert summary["status"] == "finished"
    assert summary["devices"] == ["cuda:0"]
    assert accuracy(summary) > 0.6, summary  # chance is 0.1
    logs = [e.message for e in read_events(run_dir) if e.kind == "log"]
    if strategy in ("ddp", "fsdp"):
        assert any("1 nccl rank(s), one per GPU" in m for m in logs), logs
    if strategy == "dp":
        assert not any("no CPU mode" in m for m in logs)  # the real DataParallel on CUDA
    # where each step went, from CUDA events: the parts add up to the step
    from gputui.core.breakdown import total

    steps = [e for e in read_events(run_dir) if e.kind == "step"]
    assert steps and all(e.breakdown for e in steps)
    for e in steps:
        bd = e.per_device[0].breakdown
        assert bd.compute_s > 0 and total(bd) == pytest.approx(bd.step_s)


def test_a_comm_delay_on_the_gpu_shows_as_exposed_comm(tmp_path):
    """ddp over NCCL on GPU 0: each bucket's all-reduce held back 50 ms (debug.comm_delay_s);
    the CUDA events see the step wait for it."""
    from statistics import median

    _, run_dir = run(tmp_path, "--strategy", "ddp", "--epochs", "1", "--set",
                     "debug.comm_delay_s=0.05", "--set", "run.log_every=5")
    steps = [e for e in read_events(run_dir) if e.kind == "step"][1:]
    assert median(e.breakdown.comm_exposed_s for e in steps) >= 0.035


def test_telemetry_reads_the_gpu(tmp_path):
    summary, run_dir = run(tmp_path, "--strategy", "single", "--epochs", "4")
    rows = [e for e in read_events(run_dir, "telemetry.jsonl") if e.device == "cuda:0"]
    assert rows, "no cuda:0 rows in telemetry.jsonl"
    assert all(r.mem_total and r.mem_used is not None for r in rows)
    assert max(r.util or 0 for r in rows) > 0  # NVML saw the GPU work
    assert max(r.mem_used for r in rows) > 0


def test_checkpoint_and_resume_on_the_gpu(tmp_path):
    first, run_dir = run(tmp_path, "--strategy", "single", "--epochs", "1")
    assert (run_dir / "checkpoint.pt").is_file()
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True, map_location="cpu")
    assert state  # loads with weights_only, as resume does
    proc = subprocess.run([*GPUTUI, "resume", str(run_dir), "--epochs", "3", "--json",
                           "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads(proc.stdout)
    assert resumed["status"] == "finished" and resumed["devices"] == ["cuda:0"]
    assert accuracy(resumed) > 0.6


async def test_the_app_runs_a_gpu_preset_to_the_end(tmp_path):
    """The app, with real NVML discovery, from a GPU preset to a finished run on cuda:0 whose
    device panel showed the GPU busy."""
    pytest.importorskip("textual")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
    from scripted import wait_until

    from gputui.tui.app import make_app
    from gputui.tui.screens.run import RunScreen
    from gputui.tui.widgets.device_picker import DevicePicker

    preset = tmp_path / "gpu.toml"
    preset.write_text('[run]\nname = "gpu-app"\nepochs = 3\n[devices]\nspec = "0"\n'
                      '[telemetry]\ninterval_s = 0.25\n', encoding="utf-8")
    app = make_app(preset, runs_dir=tmp_path / "runs", presets=[preset])
    async with app.run_test(size=(140, 44)) as pilot:
        picker = app.screen.query_one(DevicePicker)
        await wait_until(pilot, lambda: not picker.waiting, timeout=30, what="GPU discovery")
        assert picker.spec == "cuda:0"
        await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30,
                         what="the run screen")
        screen = app.screen
        await wait_until(pilot, lambda: screen.ended, timeout=300, what="the run to finish")
        assert screen.state == "finished"
        panel = next(p for p in screen.query(".device-panel") if p.device == "cuda:0")
        assert max(panel.util_history, default=0) > 0
        run_dir = Path(screen.handle.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["devices"] == ["cuda:0"]
