"""dp and model_parallel on two real CUDA GPUs against single on one (skipped without them).

The CPU tests prove the arithmetic; these prove the CUDA paths: DataParallel's scatter,
replicate and gather, and model_parallel's non_blocking activation and gradient copies between
devices with the pipeline schedule and per-device CUDA event timing.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from gputui.train import strategies
from gputui.hw.discovery import discover_gpus, resolve_devices
from gputui.train.data import TensorBatches
from strategy_harness import assert_params_close, make_config, params, small_data

STEPS = 5
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(len(discover_gpus()[0]) < 2, reason="needs 2 CUDA GPUs")]


def run_on_devices(cfg, steps: int = STEPS, meter_last: bool = False):
    """Like the harness's run_steps, with the batches on the strategy's data device."""
    ds = small_data()
    strategy = strategies.load(cfg.strategy.name)(cfg, resolve_devices(cfg.devices.spec),
                                                      ds.in_channels, ds.image_size,
                                                      ds.num_classes)
    strategy.setup()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device())
    for i, (x, y) in enumerate(itertools.islice(batches.epoch(1), steps)):
        strategy.train_step(x, y, 0.0 if meter_last and i == steps - 1 else None)
    torch.cuda.synchronize()
    return strategy


@pytest.fixture(autouse=True)
def _exact_float32():
    """TF32 convolutions would make every comparison loose; compare in true float32."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("name,extra", [
    ("scratch", {}), ("scratch", {"strategy.split_weights": [0.75, 0.25]}),
    ("dp", {}), ("dp", {"optim.micro_batches": 2}),
    ("model_parallel", {}), ("model_parallel", {"strategy.pipeline_chunks": 4}),
])
def test_two_gpus_equal_one(name, extra):
    reference = run_on_devices(make_config("single", "0", "lenet", 32))
    strategy = run_on_devices(make_config(name, "0,1", "lenet", 32, **extra), meter_last=True)
    # Different summation order across devices: float32 tolerance, a little wider than on CPU.
    assert_params_close(params(strategy.primary_model()), params(reference.model),
                        rtol=1e-4, atol=1e-5)
    report = strategy.step_report()
    assert [d.device for d in report.devices] == ["cuda:0", "cuda:1"]
    assert sum(d.samples for d in report.devices) >= 32
    if name == "dp":  # every GPU's own bar, from events on its own stream
        for d in report.devices:
            assert d.breakdown.compute_s > 0 and d.breakdown.step_s > 0
    if name == "model_parallel":
        assert {p.device for p in strategy.stages[1].parameters()} == {torch.device("cuda:1")}
        assert report.comm_s > 0 and all(d.compute_s > 0 for d in report.devices)
    else:
        assert isinstance(strategy.wrapped, torch.nn.DataParallel)
        assert strategy.wrapped.device_ids == [0, 1] and not strategy.notes


def test_ddp_and_fsdp_over_nccl_on_two_gpus_equal_single(tmp_path):
    """The CPU suite's ddp/fsdp scenarios, one NCCL rank per GPU, against single on the CPU."""
    import subprocess
    import sys
    from pathlib import Path

    from ddp_scenarios import SCENARIOS
    from strategy_harness import run_steps

    out = tmp_path / "scenarios.pt"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("ddp_scenarios.py")),
                           str(out), "0,1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = torch.load(out, weights_only=False)
    for name in ("ddp_even", "ddp_odd", "ddp_uneven", "ddp_micro", "fsdp", "fsdp_micro"):
        _, model, batch, _, _ = SCENARIOS[name]
        reference, _ = run_steps(make_config("single", "cpu", model, batch), STEPS)
        for rank in (0, 1):
            assert_params_close(ranks[rank][name]["params"], params(reference.model),
                                rtol=1e-4, atol=1e-5)
