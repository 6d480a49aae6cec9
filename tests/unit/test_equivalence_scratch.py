"""scratch (the from-scratch allreduce) against single: same global batch, same seed, same
parameters after several steps, on 2 and 3 CPU virtual devices, even and uneven batches."""

from __future__ import annotations

import pytest
import torch

from gputui.train.models import build_model
from gputui.train.strategies.scratch import ReplicaMismatch, allreduce, split_sizes
from rounding import assert_equal_within_rounding
from strategy_harness import ADAMW, make_config, params, run_steps

STEPS = 5
_single_cache: dict = {}


def single_run(model: str, batch: int, **extra):
    """The reference single run (its strategy, which carries its rounding bound) and its
    losses."""
    key = (model, batch, repr(sorted(extra.items())))
    if key not in _single_cache:
        _single_cache[key] = run_steps(make_config("single", "cpu", model, batch, **extra), STEPS)
    return _single_cache[key]


def single_params(model: str, batch: int, **extra):
    strategy, losses = single_run(model, batch, **extra)
    return params(strategy.model), losses


@pytest.mark.parametrize("model", ["lenet", "mlp"])
@pytest.mark.parametrize("spec", ["cpu*2", "cpu*3"])
@pytest.mark.parametrize("batch", [32, 25])  # 25 splits 13/12 and 9/8/8
def test_scratch_equals_single(model, spec, batch):
    reference, ref_losses = single_params(model, batch)
    strategy, losses = run_steps(make_config("scratch", spec, model, batch,
                                             **{"strategy.check_replicas": True}), STEPS)
    init = params(build_model(model, 1, 28, 10, seed=3, init="default"))
    moved = max((reference[k] - init[k]).abs().max().item() for k in init)
    assert moved > 1e-3  # training really changed the parameters, so equality means something
    for replica in strategy.replicas:  # every replica, not only the first
        assert_equal_within_rounding(params(replica), single_run(model, batch)[0])
    assert losses == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.parametrize("model,spec,batch", [("lenet", "cpu*2", 32), ("mlp", "cpu*3", 25)])
def test_adamw_with_warmup_cosine_and_clipping_equals_single(model, spec, batch):
    """Every replica takes the same AdamW step (its own optimizer, on the all-reduced
    gradients, clipped by their norm at the schedule's lr), so each equals single."""
    reference, ref_losses = single_params(model, batch, **ADAMW)
    strategy, losses = run_steps(make_config("scratch", spec, model, batch, **ADAMW,
                                             **{"strategy.check_replicas": True}), STEPS)
    init = params(build_model(model, 1, 28, 10, seed=3, init="default"))
    assert max((reference[k] - init[k]).abs().max().item() for k in init) > 1e-3
    for replica in strategy.replicas:
        assert_equal_within_rounding(params(replica), single_run(model, batch, **ADAMW)[0])
    assert losses == pytest.approx(ref_losses, rel=1e-5)


def test_uneven_split_weights_still_give_the_full_batch_update():
    reference, _ = single_params("lenet", 40)
    strategy, _ = run_steps(make_config("scratch", "cpu*2", "lenet", 40,
                                        **{"strategy.split_weights": [0.8, 0.2]}), STEPS)
    assert split_sizes(40, 2, [0.8, 0.2]) == [32, 8]
    assert_equal_within_rounding(params(strategy.replicas[1]), single_run("lenet", 40)[0])


def test_accumulation_equals_one_big_batch():
    for spec, strategy_name in (("cpu", "single"), ("cpu*2", "scratch")):
        strategy, _ = run_steps(make_config(strategy_name, spec, "mlp", 32,
                                            **{"optim.micro_batches": 4}), STEPS)
        assert_equal_within_rounding(params(strategy.primary_model()), single_run("mlp", 32)[0])


def test_replicas_are_distinct_tensors():
    strategy, _ = run_steps(make_config("scratch", "cpu*3", "mlp", 30), 1)
    ptrs = [{p.data_ptr() for p in r.parameters()} for r in strategy.replicas]
    assert not (ptrs[0] & ptrs[1]) and not (ptrs[1] & ptrs[2])


def test_check_replicas_catches_a_diverged_replica():
    strategy, _ = run_steps(make_config("scratch", "cpu*2", "mlp", 32), 1)
    with torch.no_grad():
        next(strategy.replicas[1].parameters()).add_(1e-3)
    with pytest.raises(ReplicaMismatch, match=r"^replica 1 differs from replica 0 in '0.1.weight'"):
        strategy.check_replicas()


def test_allreduce_sums_and_broadcasts():
    data = [torch.full((3,), float(i + 1)) for i in range(3)]
    allreduce(data)
    for t in data:
        assert torch.equal(t, torch.full((3,), 6.0))


@pytest.mark.parametrize("total,n,weights,expected", [
    (25, 2, None, [13, 12]), (25, 3, None, [9, 8, 8]), (10, 3, [1, 1, 8], [1, 1, 8]),
    (100, 2, [0.8, 0.2], [80, 20]), (3, 3, [100, 1, 1], [1, 1, 1]), (7, 2, [1, 2], [2, 5]),
])
def test_split_sizes(total, n, weights, expected):
    sizes = split_sizes(total, n, weights)
    assert sizes == expected and sum(sizes) == total
