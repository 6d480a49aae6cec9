"""A classification run's test loss (issue 26: a validation-loss curve beside the training
loss for every task): each in-process strategy's evaluation reports the test set's mean
cross-entropy, equal to single-device training's and to the loss computed by hand, and the
loop puts it in the epoch's event and the record."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from gputui.train import strategies
from gputui.core.events import EpochEnd
from gputui.core.runstore import summarize
from gputui.hw.discovery import resolve_devices
from gputui.train.data import TensorBatches
from gputui.train.loop import evaluate_with_loss, train
from strategy_harness import make_config, run_steps, small_data

STEPS = 3


def by_hand(model: torch.nn.Module, ds) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` on the test set, in one forward."""
    model.eval()
    with torch.no_grad():
        out = model(ds.test_x)
    model.train()
    return ((out.argmax(1) == ds.test_y).double().mean().item(),
            F.cross_entropy(out, ds.test_y).item())


@pytest.fixture(scope="module")
def single_scores():
    """single's test accuracy and loss after STEPS steps (checked against a hand-computed
    forward once)."""
    ds = small_data()
    reference, _ = run_steps(make_config("single", "cpu", "lenet", 32), STEPS)
    acc, loss = evaluate_with_loss(reference, ds)
    assert (acc, loss) == pytest.approx(by_hand(reference.model, ds), rel=1e-5)
    assert 0.5 < loss < 5.0  # a cross-entropy over 10 classes, not a count or a sum
    return acc, loss


@pytest.mark.parametrize("strategy,spec", [("scratch", "cpu*2"), ("dp", "cpu*2"),
                                           ("model_parallel", "cpu*2")])
def test_every_in_process_strategy_reports_the_test_loss_of_single(strategy, spec,
                                                                  single_scores):
    other, _ = run_steps(make_config(strategy, spec, "lenet", 32), STEPS)
    assert evaluate_with_loss(other, small_data()) == pytest.approx(single_scores, rel=1e-4)


def test_the_epoch_event_and_the_summary_carry_the_test_loss():
    cfg = make_config("single", "cpu", "lenet", 32, **{"run.epochs": 2, "run.log_every": 5})
    ds = small_data()
    s = strategies.load("single")(cfg, resolve_devices("cpu"), ds.in_channels,
                                      ds.image_size, ds.num_classes)
    s.setup()
    events: list = []
    train(cfg, s, TensorBatches(ds.train_x, ds.train_y, s.batch_size, cfg.run.seed), ds,
          events.append, lambda: False)
    epochs = [e for e in events if isinstance(e, EpochEnd)]
    assert [e.epoch for e in epochs] == [1, 2]
    assert epochs[-1].test_loss == pytest.approx(by_hand(s.model, ds)[1], rel=1e-5)
    assert epochs[1].test_loss < epochs[0].test_loss  # it learns: the held-out loss falls
    summary = summarize(events)
    assert [e.test_loss for e in summary.per_epoch] == [e.test_loss for e in epochs]
