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


@pytest.fixture(scope="module")
def ranks8(tmp_path_factory):
    """The 3-D scenarios on 8 gloo ranks (one launch)."""
    out = tmp_path_factory.mktemp("mesh8") / "ranks.pt"
    proc = subprocess.run([sys.executable, str(HERE / "tp_ranks.py"), str(out), "8"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(tp_ranks.SCENARIOS8))
def test_a_3d_mesh_equals_single(ranks8, name):
    """dp_shard x tp x pp on 8 ranks: the same parameters, losses and validation score as
    single, and its checkpoint restores them."""
    from rounding import assert_equal_within_rounding

    _, size, extra = tp_ranks.SCENARIOS8[name]
    single, losses, score = tp_ranks.single_reference(size, extra)
    for rank in range(8):
        got = ranks8[rank]["strategies"][name]
        assert_equal_within_rounding(got["params"], single)
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
        assert got["score"] == pytest.approx(score, rel=1e-5)
        assert_params_close(got["resumed_params"], got["params"])
    rows = ranks8[0]["strategies"][name]["memory"]
    assert len(rows) == 8 and all(r["params"] > 0 for r in rows)


@pytest.mark.slow
def test_timer_marks_four_all_reduces_per_block(ranks):
    shape = tp_ranks.SHAPE
    per_block = 4  # forward: attention and MLP outputs; backward: their inputs' gradients
    activation = tp_ranks.BATCH * shape["context"] * shape["n_embd"] * 4  # fp32 bytes
    for rank in range(4):
        assert ranks[rank]["spans"] == per_block * shape["n_layer"]  # the metered step only
        # each named where it runs: the step's collectives are all tp's all-reduces
        assert ranks[rank]["kinds"] == {"tp all-reduce": per_block * shape["n_layer"]}
        assert ranks[rank]["nbytes"] == per_block * shape["n_layer"] * activation


@pytest.mark.slow
@pytest.mark.parametrize("name", list(tp_ranks.SCENARIOS))
def test_the_strategy_equals_single(ranks, name):
    from rounding import assert_equal_within_rounding

    assert set(tp_ranks.RESUMED) <= set(tp_ranks.SCENARIOS)
    _, size, extra = tp_ranks.SCENARIOS[name]
    single, losses, score = tp_ranks.single_reference(size, extra)
    for rank in range(4):
        got = ranks[rank]["strategies"][name]
        assert got["batch_size"] == size  # the global batch
        assert_equal_within_rounding(got["params"], single)
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
        assert got["score"] == pytest.approx(score, rel=1e-5)  # validation loss, all ranks
        if name in tp_ranks.RESUMED:  # its checkpoint, restored (the others: its layout's)
            assert_params_close(got["resumed_params"], got["params"])
    rows = ranks[0]["strategies"][name]["memory"]
    assert len(rows) == 4 and all(r["params"] > 0 for r in rows)


def test_why_not_names_the_model_and_the_heads():
    from gputui.train.gpt import GPTShape, gpt
    from gputui.train.parallelize import why_not_tp

    assert "built-in GPT" in why_not_tp(torch.nn.Sequential(torch.nn.Linear(2, 2)), 2)
    assert "model.n_head = 3 does not split over 2" in why_not_tp(
        gpt(GPTShape(n_head=3, n_embd=48, n_layer=1)), 2)
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
    from gputui.train.parallelize import apply_tp

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = apply_tp(gpt(GPTShape(context=8, n_layer=1, n_embd=32)),
                                init_device_mesh("cpu", (1,)))
        with ActivationMeter() as meter:
            model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
        assert meter.peak["cpu"] > 2 * 8 * 32 * 4  # at least one saved activation
    finally:
        dist.destroy_process_group()


def _whole(name: str) -> dict:
    """single's bytes of parameters, gradients and optimizer state after the scenario's steps."""
    from gputui.train import memory

    _, size, extra = tp_ranks.SCENARIOS[name]
    single, _, _ = tp_ranks.single_reference(size, extra)
    return memory.counted(single.model, [single.opt])


@pytest.mark.slow
@pytest.mark.parametrize("name, params, grads, optim", [
    ("fsdp_zero2", 4, 4, 4),  # at rest: parameters, gradients and state sharded over 4
    ("fsdp_zero1", 1, 1, 4),  # only the optimizer state sharded
    ("hsdp", 2, 2, 2),  # 2 replicas of 2 shards: a half each
    ("ddp_ac_selective", 1, 1, 1),  # replicas: everything whole
])
def test_each_zero_stage_holds_its_share_per_rank(ranks, name, params, grads, optim):
    """The memory rows of each ZeRO stage: 1/N of the whole (N: the ranks each kind of state
    is sharded over) within fully_shard's padding, or whole where it is not sharded."""
    whole = _whole(name)
    rows = ranks[0]["strategies"][name]["memory"]
    assert len(rows) == 4
    for key, n in (("params", params), ("grads", grads), ("optim", optim)):
        got = [row[key] for row in rows]
        if n == 1:
            assert got == [whole[key]] * 4, (key, got, whole)
        elif key == "optim" and name == "fsdp_zero1":
            # ZeroRedundancyOptimizer partitions whole parameters: the shares add up to the
            # whole, none holds more than its fair share and the largest tensor's state
            assert sum(got) == whole[key] and max(got) < whole[key] / 2, (got, whole)
        else:  # fully_shard pads each tensor's first dimension to a multiple of the shards
            for g in got:
                assert whole[key] / n <= g <= whole[key] / n * 1.25, (key, got, whole)


@pytest.mark.parametrize("model", ["gpt", "user"])
def test_activation_checkpointing_keeps_less_and_trains_the_same(model):
    """full keeps only each block's input, selective also the matmuls' and attention's
    outputs: both save less for backward than none, full the least (a user's model: its
    declared blocks, full against none), and every mode trains the same parameters."""
    import user_model
    from strategy_harness import GPT_SMALL, data_for, make_config, params, run_steps

    from gputui.train import memory

    modes = ("none", "selective", "full") if model == "gpt" else ("none", "full")
    extra = ({**GPT_SMALL, "model.n_layer": 4} if model == "gpt"
             else {"model.factory": user_model.NET})
    peaks, trained = {}, {}
    for mode in modes:
        cfg = make_config("single", "cpu", "gpt" if model == "gpt" else "lenet", 8, **extra,
                          **{"parallel.ac": mode})
        strategy, _ = run_steps(cfg, 2)
        ds = data_for(cfg)
        with memory.ActivationMeter() as meter:
            strategy.train_step(ds.train_x[:8], ds.train_y[:8], data_s=0.0)  # metered
        peaks[mode] = meter.peak["cpu"]
        trained[mode] = params(strategy.model)
        row = strategy.step_report().devices[0]  # the recompute, timed inside backward
        if mode == "none":
            assert row.recompute_s is None
        else:
            assert 0 < row.recompute_s < row.breakdown.step_s, row
    # selective's kept outputs live in torch's checkpoint cache, which autograd's saved-tensor
    # hooks (the meter) do not see: its figure is not reported (memory_rows), only checked
    # here to be no more than none's
    assert peaks["full"] < peaks["none"] and peaks.get("selective", 0) < peaks["none"], peaks
    for mode in modes[1:]:
        for k, v in trained["none"].items():
            torch.testing.assert_close(trained[mode][k], v, rtol=1e-5, atol=1e-6)
