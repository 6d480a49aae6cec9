"""A transformer "of the user's own", as a newcomer writes one: a plain nn.Module holding its
blocks in an nn.ModuleList, each block built on nn.MultiheadAttention, trained on text. Named
to gputui as a factory (``path/to/user_transformer.py:build``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve()
TRANSFORMER = f"{HERE}:build"


class MyBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class MyTransformer(nn.Module):
    def __init__(self, vocab: int, context: int, width: int = 32, heads: int = 2,
                 layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([MyBlock(width, heads) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(channels: int, height: int, width: int, classes: int) -> MyTransformer:
    """For text, gputui calls a factory as (1, 1, context, vocab)."""
    return MyTransformer(classes, width)
