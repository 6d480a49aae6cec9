"""The equivalence tests' tolerance (rounding.py) holds a correct strategy and catches a wrong
one: a bug in how gradients are scaled or clipped moves the parameters far beyond what
float32 rounding may, while a reordered sum stays within it."""

from __future__ import annotations

import pytest
import torch

import rounding
from gputui.train import optim
from gputui.train.strategies import base
from strategy_harness import ADAMW, make_config, params, run_steps

STEPS = 5


def run_pair(strategy: str, spec: str, batch: int, bug=None, **extra):
    """(reference single run, the strategy's parameters) over the same batches; ``bug()``
    is called between the two, so only the strategy runs with it."""
    opt = {k: v for k, v in extra.items()
           if k not in ("optim.micro_batches", "strategy.split_points")}
    reference, _ = run_steps(make_config("single", "cpu", "lenet", batch, **opt), STEPS)
    if bug is not None:
        bug()
    got, _ = run_steps(make_config(strategy, spec, "lenet", batch, **extra), STEPS)
    return reference, params(got.primary_model())


@pytest.mark.parametrize("t", [1, 2, 5, 50])
def test_adam_step_bound_holds_for_any_gradients(t):
    """|m^/sqrt(v^)| never exceeds the bound, for random gradients and for the worst kind:
    one large gradient followed by tiny ones of the same sign."""
    assert rounding.adam_step_bound(0.9, 0.95, 1) == pytest.approx(1.0)
    gen = torch.Generator().manual_seed(t)
    sequences = [torch.randn(t, 1000, generator=gen),
                 torch.cat([torch.full((1, 1), 1.0), torch.full((t - 1, 1), 1e-6)])]
    for grads in sequences:
        p = torch.zeros(grads.shape[1], requires_grad=True)
        opt = torch.optim.Adam([p], lr=1.0, betas=(0.9, 0.95), eps=0.0)
        for g in grads:
            before = p.detach().clone()
            p.grad = g.clone()
            opt.step()
            step = (before - p.detach()).abs().max().item()
            assert step <= rounding.adam_step_bound(0.9, 0.95, int(opt.state[p]["step"])) + 1e-6


@pytest.mark.parametrize("optimizer", [{}, ADAMW], ids=["sgd", "adamw"])
def test_a_reordered_sum_stays_within_the_bound(optimizer):
    """Micro-batches of 8, 8, 7 and 7 sum the gradient in another order: within rounding
    (this case was 1.08e-06 off against the old fixed 1e-06 under AdamW)."""
    reference, got = run_pair("model_parallel", "cpu*2", 30, **optimizer,
                              **{"optim.micro_batches": 4})
    assert rounding.ratio(got, reference) < 1
    rounding.assert_equal_within_rounding(got, reference)


@pytest.mark.parametrize("optimizer", [{}, ADAMW], ids=["sgd", "adamw"])
def test_a_mean_of_micro_batch_means_exceeds_the_bound(optimizer, monkeypatch):
    """The classic accumulation bug: each uneven micro-batch (8, 8, 7, 7) weighted 1/4
    instead of by its share of the batch."""
    plain = base.Strategy.scaled_loss
    reference, got = run_pair("model_parallel", "cpu*2", 30, bug=lambda: monkeypatch.setattr(
        base.Strategy, "scaled_loss",
        lambda self, out, y, denom: plain(self, out, y, len(y) * self.micro)), **optimizer,
                              **{"optim.micro_batches": 4})
    assert rounding.ratio(got, reference) > 100
    with pytest.raises(AssertionError, match="times what float32 rounding allows"):
        rounding.assert_equal_within_rounding(got, reference)


def test_a_gradient_scaled_by_a_thousandth_exceeds_the_bound_under_sgd(monkeypatch):
    """(Under clipped AdamW a uniform scaling changes nothing: clipping and Adam's division
    both remove it; a non-uniform one is caught there, as in the tests around this one.)"""
    plain = base.Strategy.scaled_loss
    reference, got = run_pair("model_parallel", "cpu*2", 32, bug=lambda: monkeypatch.setattr(
        base.Strategy, "scaled_loss",
        lambda self, out, y, denom: plain(self, out, y, denom) * 1.001))
    assert rounding.ratio(got, reference) > 100


def test_a_clip_norm_over_one_stage_exceeds_the_bound(monkeypatch):
    """model_parallel clips by the norm over both stages' gradients; taking only the first
    stage's is caught."""
    def first_device_only(params, max_norm, reduce_sq=None):
        params = [p for p in params if p.grad is not None]
        first = params[:len(params) // 2]  # lenet's two conv layers: stage 0 of split [2]
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in first]))
        for p in params:
            p.grad.mul_(min(1.0, max_norm / (norm.item() + 1e-6)))
        return norm

    reference, got = run_pair("model_parallel", "cpu*2", 32, **ADAMW, bug=lambda: (
        monkeypatch.setattr(optim, "clip_grad_norm", first_device_only)),
        **{"strategy.split_points": [2]})
    assert rounding.ratio(got, reference) > 100
