"""What only a GPU shows, beside the acceptance suite: ddp's and fsdp's checkpoints resumed on
cuda:0, the energy and GPM figures NVML gives for a run, and the GPT compiled in bf16 with its
MFU measured against the GPU's named peak and the CUDA allocator's peak memory
(``pytest -m gpu``; skipped without CUDA). scripts/gpu-check.sh runs these with the rest.
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


def gputui(tmp_path: Path, *args: str, timeout: int = 300) -> tuple[dict, Path]:
    """``gputui ARGS --json`` with the runs under tmp_path: the summary and the run's folder."""
    proc = subprocess.run([*GPUTUI, *args, "--json", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    return summary, Path(summary["run_dir"])


def lines(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / name).read_text().splitlines() if ln.strip()]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_strategy_resumes_its_checkpoint_on_the_gpu(tmp_path, strategy):
    """One NCCL rank writes its checkpoint (fsdp: gathered from the shards), a new launch reads
    it and trains on, to the epochs asked, still on cuda:0 and still learning."""
    first, run_dir = gputui(tmp_path, "run", "quickstart", "--devices", "0", "--strategy",
                            strategy, "--epochs", "1")
    assert first["status"] == "finished" and (run_dir / "checkpoint.pt").is_file()
    resumed, _ = gputui(tmp_path, "resume", str(run_dir), "--epochs", "3")
    assert resumed["status"] == "finished" and resumed["devices"] == ["cuda:0"]
    assert resumed["epochs_done"] == 3
    acc = resumed["test_acc"] / 100 if resumed["test_acc"] > 1 else resumed["test_acc"]
    assert acc > 0.6, resumed  # chance is 0.1


def test_energy_and_gpm_come_from_nvml_for_a_gpu_run(tmp_path):
    """energy.json holds each epoch's joules of cuda:0 (the energy counter), telemetry's
    counter only grows, and where the GPU gives GPM (Hopper and newer) the rows carry SM
    activity that saw the training."""
    from gputui.hw import nvml
    from gputui.runs import energy

    summary, run_dir = gputui(tmp_path, "run", "quickstart", "--devices", "0", "--epochs", "3",
                              "--set", "telemetry.interval_s=0.25")
    per_epoch = energy.read(run_dir)
    assert [e["epoch"] for e in per_epoch] == [1, 2, 3]
    assert all(e["joules"] > 0 for e in per_epoch), per_epoch
    figures = energy.run_figures(run_dir)
    assert figures["j_per_sample"] > 0
    rows = [r for r in lines(run_dir, "telemetry.jsonl") if r.get("device") == "cuda:0"]
    counter = [r["energy_j"] for r in rows if r.get("energy_j") is not None]
    assert len(counter) >= 2 and counter == sorted(counter) and counter[-1] > counter[0]
    assert nvml.init(), nvml.reason()
    gpus, why = nvml.cuda_gpus()
    assert gpus, why
    if nvml.gpm_supported(nvml.handle(gpus[0].uuid)):
        active = [r["sm_active"] for r in rows if r.get("sm_active") is not None]
        assert active and max(active) > 0, rows[-3:]


def test_the_gpt_compiled_in_bf16_is_measured_against_the_gpus_peak(tmp_path):
    """A small GPT, bf16 autocast and torch.compile on cuda:0: it compiles (no fallback), its
    loss falls, its MFU is a share of the peak of the GPU's data sheet where gputui lists the
    GPU, and the record keeps the CUDA allocator's peak memory."""
    from gputui.train.flops import table_peak

    summary, run_dir = gputui(
        tmp_path, "run", "gpt2-small-1gpu", "--devices", "0", "--epochs", "1",
        "--set", "model.n_layer=2", "--set", "model.n_embd=128", "--set", "model.n_head=4",
        "--set", "data.context=128", "--set", "data.train_size=640", "--set",
        "data.test_size=64", "--set", "run.log_every=5", "--set", "optim.warmup_steps=5")
    assert summary["status"] == "finished" and summary["devices"] == ["cuda:0"]
    evs = list(read_events(run_dir))
    assert not [e.message for e in evs if e.kind == "log" and "compile" in e.message.lower()
                and "fail" in e.message.lower()]
    init = next(e for e in evs if e.kind == "init_done")
    assert init.compile_s > 0
    flops = next(e for e in evs if e.kind == "flops")
    assert flops.dtype == "bf16" and flops.peak_flops
    name = torch.cuda.get_device_name(0)
    if table_peak(name, "bf16") is not None:
        assert flops.peak_flops == pytest.approx(table_peak(name, "bf16"))
        assert "measured" not in flops.source
    steps = [e for e in evs if e.kind == "step"]
    mfus = [e.mfu for e in steps if e.mfu is not None]
    assert mfus and all(0 < m <= 1 for m in mfus), mfus
    assert steps[-1].loss < steps[0].loss
    peaks = [r.peak for e in evs if e.kind == "memory" for r in e.per_device
             if r.peak is not None]
    assert peaks and max(peaks) > 0
