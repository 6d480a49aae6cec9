"""scratch (the from-scratch allreduce) against single: same global batch, same seed, same
parameters after several steps, on 2 and 3 CPU virtual devices, even and uneven batches."""

from __future__ import annotations

import itertools

import pytest
import torch

from gputui.train.models import build_model
from gputui.train.strategies.scratch import ReplicaMismatch, allreduce, split_sizes
from rounding import assert_equal_within_rounding
from strategy_harness import ADAMW, assert_params_close, make_config, params, run_steps

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


def test_batch_norm_replicas_normalise_their_own_shard_and_take_the_summed_step():
    """ResNet-18 (batch norm, the resnet18-2dev preset's model) on 2 replicas, step by step
    against one model by hand: in training each replica normalises its shard with that
    shard's statistics and keeps its own running statistics; the gradients summed by the
    allreduce are those of the two shards' losses (each summed over its shard, divided by
    the global batch), so every replica takes the step that one model takes from them."""
    import copy

    import torch.nn.functional as F

    from gputui.hw.discovery import resolve_devices
    from gputui.train import strategies
    from gputui.train.data import TensorBatches
    from strategy_harness import data_for

    cfg = make_config("scratch", "cpu*2", "resnet18", 8, **{"strategy.check_replicas": True})
    ds = data_for(cfg)
    strategy = strategies.load("scratch")(cfg, resolve_devices("cpu*2"), ds.in_channels,
                                          ds.image_size, ds.num_classes)
    strategy.setup()
    strategy.updater.plan(2)
    one = copy.deepcopy(strategy.replicas[0])  # the init every replica starts from
    init = params(one)
    opt = torch.optim.SGD(one.parameters(), lr=0.1, momentum=0.5)  # make_config's optimizer
    stats = [{k: v.clone() for k, v in one.named_buffers()} for _ in strategy.replicas]
    batches = TensorBatches(ds.train_x, ds.train_y, 8, cfg.run.seed, strategy.data_device())
    losses, ref_losses = [], []
    for x, y in itertools.islice(batches.epoch(1), 2):
        losses.append(strategy.train_step(x, y).item())
        opt.zero_grad()
        total = 0.0
        for i, (xs, ys) in enumerate(zip(x.split(4), y.split(4), strict=True)):
            one.load_state_dict(stats[i], strict=False)  # replica i's running statistics
            loss = F.cross_entropy(one(xs), ys, reduction="sum") / len(x)
            loss.backward()  # the gradients add up over the shards, as the allreduce sums
            total += loss.item()
            stats[i] = {k: v.clone() for k, v in one.named_buffers()}
        opt.step()
        ref_losses.append(total)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    after = params(one)
    assert max((after[k] - init[k]).abs().max().item() for k in init) > 1e-3  # it trained
    for i, replica in enumerate(strategy.replicas):
        assert_params_close(params(replica), params(one), rtol=1e-4, atol=1e-5)
        for name, value in replica.named_buffers():  # its own shards' statistics
            torch.testing.assert_close(value, stats[i][name], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=name: f"replica {i} {n}: {m}")
    mean = "1.bn1.running_mean" if "1.bn1.running_mean" in stats[0] else next(
        k for k in stats[0] if k.endswith("running_mean"))
    assert not torch.allclose(stats[0][mean], stats[1][mean])  # two shards, two statistics


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
