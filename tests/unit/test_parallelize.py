"""Tensor parallelism and fsdp x tp of the GPT (gputui.train.parallelize) against one plain
model: same init, same batches, AdamW, the same parameters after several steps (fp32), on 4
gloo ranks launched once (tp_ranks.py); and the all-reduces tp's timer marks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import tp_ranks
from strategy_harness import assert_params_close

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def reference():
    """The plain model trained on the whole batches: (losses, parameters)."""
    m = tp_ranks.model()
    losses = tp_ranks.train(m)
    return losses, {k: v.detach().clone() for k, v in m.named_parameters()}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "ranks.pt"
    proc = subprocess.run([sys.executable, str(HERE / "tp_ranks.py"), str(out)],
                          capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tp", "fsdp_tp"])
def test_equals_one_model(ranks, reference, name):
    ref_losses, ref_params = reference
    init = {k: v.detach() for k, v in tp_ranks.model().named_parameters()}
    assert max((ref_params[k] - init[k]).abs().max().item() for k in init) > 1e-3  # it trained
    for rank in range(4):
        got = ranks[rank][name]
        assert_params_close(got["params"], ref_params, rtol=1e-4, atol=1e-5)
        if name == "tp":  # every rank of a tp group computes the whole batch's loss
            assert got["losses"] == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.slow
def test_timer_marks_four_all_reduces_per_block(ranks):
    shape = tp_ranks.SHAPE
    per_block = 4  # forward: attention and MLP outputs; backward: their inputs' gradients
    activation = tp_ranks.BATCH * shape["context"] * shape["n_embd"] * 4  # fp32 bytes
    for rank in range(4):
        assert ranks[rank]["spans"] == per_block * shape["n_layer"]  # the metered step only
        assert ranks[rank]["nbytes"] == per_block * shape["n_layer"] * activation


@pytest.mark.slow
@pytest.mark.parametrize("name", list(tp_ranks.SCENARIOS))
def test_the_strategy_equals_single(ranks, name):
    from rounding import assert_equal_within_rounding
    from strategy_harness import data_for, make_config, run_steps

    from gputui.train.loop import evaluate

    _, size, extra = tp_ranks.SCENARIOS[name]
    extra = {k: v for k, v in extra.items() if not k.startswith("strategy.")}
    cfg = make_config("single", "cpu", "gpt", size, **extra)
    single, losses = run_steps(cfg, tp_ranks.STEPS)
    score = evaluate(single, data_for(cfg))
    for rank in range(4):
        got = ranks[rank]["strategies"][name]
        assert got["batch_size"] == size  # the global batch
        assert_equal_within_rounding(got["params"], single)
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
        assert got["score"] == pytest.approx(score, rel=1e-5)  # validation loss, all ranks
        assert_params_close(got["resumed_params"], got["params"])  # its checkpoint, restored
    rows = ranks[0]["strategies"][name]["memory"]
    assert len(rows) == 4 and all(r["params"] > 0 for r in rows)


def test_why_not_names_the_model_and_the_heads():
    from gputui.train.gpt import GPTShape, gpt
    from gputui.train.parallelize import why_not_tp

    assert "built-in GPT" in why_not_tp(torch.nn.Sequential(torch.nn.Linear(2, 2)), 2)
    assert "3 attention heads" in why_not_tp(gpt(GPTShape(n_head=3, n_embd=48, n_layer=1)), 2)
    assert why_not_tp(gpt(GPTShape(n_layer=1)), 2) is None


def test_the_plan_says_why_tp_cannot_run():
    from gputui.hw.discovery import resolve_devices
    from gputui.plan import why_not
    from strategy_harness import make_config

    lenet = make_config("single", "cpu", "lenet", 32)  # the config checks refuse tp with it
    gpt = make_config("single", "cpu", "gpt", 16)  # 2 heads
    for name, cfg, spec, reason in [
            ("tp", lenet, "cpu*2", "model.name = 'gpt'"),
            ("tp", gpt, "cpu", "at least 2 devices"),
            ("tp", gpt, "cpu*4", "model.n_head = 2 does not split over 4"),
            ("fsdp_tp", lenet, "cpu*4", "model.name = 'gpt'"),
            ("fsdp_tp", gpt, "cpu*2", "several groups of strategy.tp_size = 2")]:
        assert reason in why_not(cfg.replace(strategy={"name": name}), resolve_devices(spec))
    assert why_not(gpt.replace(strategy={"name": "tp"}), resolve_devices("cpu*2")) is None
    assert why_not(gpt.replace(strategy={"name": "fsdp_tp"}), resolve_devices("cpu*4")) is None


def test_activation_meter_counts_a_tp_models_saved_shards(tmp_path):
    """The first step's saved-tensor hooks see DTensors in a tp model (one rank here)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from gputui.train.gpt import GPTShape, gpt
    from gputui.train.memory import ActivationMeter
    from gputui.train.parallelize import parallelize_gpt

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = parallelize_gpt(gpt(GPTShape(context=8, n_layer=1, n_embd=32)),
                                init_device_mesh("cpu", (1,)))
        with ActivationMeter() as meter:
            model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
        assert meter.peak["cpu"] > 2 * 8 * 32 * 4  # at least one saved activation
    finally:
        dist.destroy_process_group()
