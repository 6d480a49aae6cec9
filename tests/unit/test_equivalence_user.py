"""A model of the user's own (tests/unit/user_model.py, outside gputui, named as a factory)
trains under scratch, dp and model_parallel exactly as under single: same global batches,
same seed, same parameters after several steps (ddp and fsdp: test_equivalence_ddp.py)."""

from __future__ import annotations

import pytest

import user_model
from gputui.train.strategies.model_parallel import ModelParallel
from rounding import assert_equal_within_rounding
from strategy_harness import make_config, params, run_steps

STEPS = 5
_single: dict = {}


def user_config(strategy: str, spec: str, factory: str, **extra):
    return make_config(strategy, spec, "lenet", 32, **{"model.factory": factory, **extra})


def kwargs_for(factory: str) -> dict:
    """model.kwargs passed through to the factory (build_net takes a width)."""
    return {"model.kwargs": {"hidden": 6}} if factory == user_model.NET else {}


def single(factory: str):
    if factory not in _single:
        _single[factory] = run_steps(user_config("single", "cpu", factory, **kwargs_for(factory)),
                                     STEPS)
    return _single[factory]


CASES = [  # (strategy, devices, factory, extra config)
    ("scratch", "cpu*2", user_model.NET, {}),
    ("dp", "cpu*2", user_model.NET, {}),
    ("model_parallel", "cpu*2", user_model.NET, {}),  # balanced over its declared blocks
    ("model_parallel", "cpu*3", user_model.NET,
     {"strategy.split_points": [1, 2], "strategy.pipeline_chunks": 2}),
    ("model_parallel", "cpu*2", user_model.SEQUENTIAL, {"strategy.split_points": [2]}),
]


@pytest.mark.parametrize("strategy,spec,factory,extra", CASES)
def test_a_user_model_trains_as_under_single(strategy, spec, factory, extra):
    ref_strategy, ref_losses = single(factory)
    got, losses = run_steps(user_config(strategy, spec, factory, **kwargs_for(factory), **extra),
                            STEPS)
    assert any(type(m).__module__.startswith("gputui_user_")  # the user's own classes
               for m in ref_strategy.model.modules())
    assert_equal_within_rounding(params(got.primary_model()), ref_strategy)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    if strategy == "model_parallel":
        assert isinstance(got, ModelParallel) and len(got.stages) == int(spec[-1])
    if factory == user_model.NET:  # the kwargs reached the factory
        assert got.primary_model().blocks[0].conv.out_channels == 6


def test_the_user_model_moved_from_its_seeded_init():
    ref_strategy, _ = single(user_model.SEQUENTIAL)
    fresh = run_steps(user_config("single", "cpu", user_model.SEQUENTIAL), 0)[0]
    moved = max((a - b).abs().max().item() for a, b in
                zip(params(ref_strategy.model).values(), params(fresh.model).values()))
    assert moved > 1e-3  # training changed the parameters, so equality above means something
