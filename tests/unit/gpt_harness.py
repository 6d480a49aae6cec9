"""Build a strategy on the built-in models or on the GPT (test helper for pp's equivalence).

The GPT is ``gpt(GPTShape(...))`` itself, tiny, on random byte tokens, with the next-token
loss: the strategy classes are subclassed here only to build it and to take ``lm_loss``.
"""

from __future__ import annotations

import itertools

import torch

from gputui.core import registry
from gputui.hw.discovery import resolve_devices
from gputui.train.data import TensorBatches
from gputui.train.gpt import GPTShape, gpt, lm_loss
from strategy_harness import make_config, small_data

SHAPE = GPTShape(vocab_size=64, context=16, n_layer=2, n_head=2, n_embd=32)


def gpt_class(base: type) -> type:
    """``base`` training the tiny GPT with the language-model loss."""

    class GPTStrategy(base):
        def build_model(self):
            torch.manual_seed(self.cfg.run.seed)
            return gpt(SHAPE)

        def scaled_loss(self, out, y, denom):
            return lm_loss(out, y) * (len(y) / denom)

    return GPTStrategy


def tokens(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, SHAPE.vocab_size, (n, SHAPE.context + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def build(strategy: str, spec: str, model: str, batch: int, extra: dict, rank: int = 0,
          world_size: int = 1):
    """(set-up strategy, an iterator of its global batches, the dataset) as a run has them."""
    cfg = make_config(strategy, spec, "mlp" if model == "gpt" else model, batch, **extra)
    ds = small_data()
    cls = registry.get(strategy).load()
    if model == "gpt":
        cls = gpt_class(cls)
    s = cls(cfg, resolve_devices(spec), ds.in_channels, ds.image_size, ds.num_classes,
            rank=rank, world_size=world_size)
    s.setup()
    if model == "gpt":
        x, y = tokens()
        batches = iter([(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)])
    else:
        batches = TensorBatches(ds.train_x, ds.train_y, s.batch_size, cfg.run.seed).epoch(1)
    return s, itertools.chain(batches), ds
