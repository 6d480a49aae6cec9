"""The narrow Strategy interface (gputui.train.strategies.base): checkpoints written by the
code before it load exactly, the optimizers keep the order attribute scanning gave them,
nothing appears on a strategy that its class does not declare, and the loop writes nothing to
a strategy."""

from __future__ import annotations

import sys

import pytest
import torch

from gputui.train import checkpoint as ckpt
from gputui.train.dataset import Dataset
from gputui.train.loop import train
from gputui.train.strategies.data_parallel import accelerator_present
from old_checkpoints import CASES, FIXTURES, SIZE, STEPS, batches, build, world_of_one


@pytest.fixture(scope="module")
def group():
    """ddp and fsdp set up in a gloo group of this process alone."""
    with world_of_one():
        yield


@pytest.fixture
def rng():
    """Restoring a checkpoint sets the random states: put this process's back after."""
    saved = ckpt.rng_state()
    yield
    ckpt.set_rng_state(saved)


def scanned_optimizers(strategy) -> list[torch.optim.Optimizer]:
    """How optimizers() found them before it was explicit: every optimizer attribute of the
    strategy (or list of them), in attribute order."""
    found = []
    for value in vars(strategy).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        found += [o for o in items if isinstance(o, torch.optim.Optimizer)]
    return found


def assert_same(a, b, where: str = "state") -> None:
    """Nested dicts, lists and tensors equal, tensor by tensor."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b.to(a.device)), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("name", list(CASES))
def test_a_checkpoint_written_before_the_narrow_interface_loads_exactly(name, group, rng):
    if name == "dp" and accelerator_present():
        pytest.skip("written where DataParallel wraps the model (no accelerator); with one, "
                    "dp on CPU devices names its parameters without the wrapper")
    strategy = build(name)
    assert strategy.optimizers() == scanned_optimizers(strategy)
    saved = ckpt.load(FIXTURES / f"{name}.pt")["state"]  # fsdp's restore shards what it loads
    assert ckpt.restore(strategy, ckpt.load(FIXTURES / f"{name}.pt")) == ckpt.Position(
        1, STEPS, STEPS, 1.0)
    assert_same(strategy.state_dict(), saved)
    first = strategy.models()[0].state_dict()
    for model in strategy.models()[1:]:  # scratch: every replica took the saved one
        assert_same(model.state_dict(), first)
    x, y = batches()[0]
    assert torch.isfinite(strategy.train_step(x, y))


@pytest.mark.parametrize("name", list(CASES))
def test_a_strategy_holds_only_attributes_its_classes_declare(name, group):
    strategy = build(name)
    x, y = batches()[0]
    strategy.train_step(x, y, data_s=0.0)  # metered: every path that could add one
    report = strategy.step_report()
    assert report is not None and report.devices
    fresh = type(strategy)(strategy.cfg, strategy.devices, 1, SIZE, 10)  # __init__ alone
    created = set(vars(strategy)) - set(vars(fresh))
    declared = {k for cls in type(strategy).__mro__ for k in vars(cls).get("__annotations__", {})}
    assert created, "setup created nothing?"
    assert created <= declared, f"undeclared: {sorted(created - declared)}"


def test_the_loop_writes_nothing_to_a_strategy(tmp_path, rng):
    """Every attribute set on the strategy during a run (two epochs, every step metered,
    checkpoints at each epoch end) is set by the strategy's own methods."""
    strategy = build("single")
    outside: list[tuple[str, str]] = []

    class Watched(type(strategy)):
        def __setattr__(self, key, value):
            caller = sys._getframe(1)
            if caller.f_locals.get("self") is not self:
                outside.append((key, caller.f_code.co_name))
            super().__setattr__(key, value)

    strategy.__class__ = Watched
    xs, ys = zip(*batches())
    x, y = torch.cat(xs), torch.cat(ys)
    ds = Dataset("tiny", x, y, x[:8], y[:8])
    cfg = strategy.cfg.replace(run={"log_every": 1, "epochs": 2})

    class Batches:
        steps_per_epoch = STEPS

        def epoch(self, epoch, start=0):
            return iter(batches()[start:])

    events = []
    assert train(cfg, strategy, Batches(), ds, events.append, lambda: False,
                 run_dir=tmp_path) == "finished"
    assert sum(e.kind == "step" for e in events) == 2 * STEPS
    assert outside == []


@pytest.mark.parametrize("name", ["single", "scratch", "model_parallel", "ddp"])
def test_the_grad_scaler_steps_every_optimizer_and_updates_once_per_step(name, group):
    """fp16's path (a grad scaler; on CUDA only in a run) on the CPU: every optimizer steps
    through the scaler, its scale grows once per step, and the update equals the unscaled
    one (power-of-two scales are exact)."""
    plain = build(name)
    cls = type(plain)

    class Scaled(cls):
        def make_scaler(self, device, params=None):
            self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)

    scaled = build(name, cls=Scaled)
    for x, y in batches():
        plain.train_step(x, y)
        scaled.train_step(x, y)
    assert scaled.scaler.get_scale() == 1024.0 * 2 ** STEPS
    for a, b in zip(plain.models(), scaled.models()):
        assert_same(a.state_dict(), b.state_dict())
