"""Run a strategy in this process for a few steps and return its parameters (test helper)."""

from __future__ import annotations

import itertools

import torch

import rounding
from gputui.train import strategies
from gputui.core.config import RunConfig
from gputui.hw.discovery import resolve_devices
from gputui.runs.prepare import override_checked
from gputui.train.data import TensorBatches, load_dataset

_DATA = {}


def small_data(n: int = 320):
    """A small synthetic set, generated once per process."""
    if n not in _DATA:
        _DATA[n] = load_dataset("synthetic", train_size=n, test_size=64)
    return _DATA[n]


# a GPT small enough for a test step in milliseconds, on pystdlib windows of 32 bytes
GPT_SMALL = {"data.name": "pystdlib", "data.context": 32, "model.n_layer": 2,
             "model.n_head": 2, "model.n_embd": 32}
_TEXT = {}


def small_text(context: int = 32, n: int = 320):
    """A small slice of the pystdlib text (windows of ``context``), read once per process."""
    from gputui.train.text import load_text

    if (context, n) not in _TEXT:
        _TEXT[context, n] = load_text("pystdlib", "", context, train_size=n, test_size=64)
    return _TEXT[context, n]


def data_for(cfg: RunConfig):
    """The data a config's task trains on here: text windows for a language model, else the
    small synthetic set."""
    from gputui.core.config import task_of

    return small_text(cfg.data.context) if task_of(cfg) == "lm" else small_data()


def make_config(strategy: str, spec: str, model: str, batch: int, **extra) -> RunConfig:
    """Errors name the source "config" (every key is an override from it); ``model = "gpt"``
    is GPT_SMALL on text unless ``extra`` says otherwise."""
    if model == "gpt":
        extra = {**GPT_SMALL, **extra}
    changes = [("config", "strategy.name", strategy), ("config", "devices.spec", spec),
               ("config", "model.name", model), ("config", "optim.batch_size", batch),
               ("config", "model.init", "default"), ("config", "optim.lr", 0.1),
               ("config", "optim.momentum", 0.5), ("config", "run.seed", 3)]
    changes += [("config", k, v) for k, v in extra.items()]
    return override_checked(RunConfig(), changes).config


# AdamW with a warm-up then cosine decay and clipping that acts on every step: what the
# equivalence tests add to each strategy's. Over 5 planned steps the lr rises for 2 steps, then
# falls to a tenth; the tiny models' gradient norms (0.4-2) are well above 0.05. The lr is
# small because Adam divides each gradient by its own RMS: a rounding difference of a
# reordered sum (chunks, shards) moves a parameter in proportion to the lr.
ADAMW = {"optim.name": "adamw", "optim.lr": 0.0005, "optim.betas": [0.9, 0.95],
         "optim.weight_decay": 0.1, "optim.schedule": "cosine", "optim.warmup_steps": 2,
         "optim.min_lr_ratio": 0.1, "optim.clip_grad_norm": 0.05}


def run_steps(cfg: RunConfig, steps: int = 5):
    """Train ``steps`` steps (the lr schedule planned over them); returns (strategy, list of
    per-step losses)."""
    ds = data_for(cfg)
    devices = resolve_devices(cfg.devices.spec)
    strategy = strategies.load(cfg.strategy.name)(cfg, devices, ds.in_channels,
                                                      ds.image_size, ds.num_classes)
    strategy.setup()
    if cfg.strategy.name == "single":  # a reference: how far rounding alone may move it
        rounding.watch(strategy)
    strategy.updater.plan(steps)
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device())  # as the worker's: cuda:0's on a GPU
    losses = [strategy.train_step(x, y).item()
              for x, y in itertools.islice(batches.epoch(1), steps)]
    return strategy, losses


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters()}


def assert_params_close(a: dict, b: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")


_REFERENCES: dict = {}


def single_reference(cfg: RunConfig, steps: int = 5):
    """``single`` on ``cfg`` trained ``steps`` steps (as run_steps) and evaluated on its test
    set: (strategy, losses, (test score, test loss)). Once per config and step count in this
    process (the scenarios of one model and batch share it); callers only read it."""
    from gputui.train.loop import evaluate_with_loss

    key = (cfg.to_toml(), steps)
    if key not in _REFERENCES:
        strategy, losses = run_steps(cfg, steps)
        _REFERENCES[key] = strategy, losses, evaluate_with_loss(strategy, data_for(cfg))
    return _REFERENCES[key]
