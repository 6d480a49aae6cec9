"""A GPT-style decoder-only transformer, built as an ``nn.Sequential`` of coarse blocks.

Token and position embeddings (:class:`Embed`), pre-norm blocks of causal self-attention
through ``scaled_dot_product_attention`` and an MLP (:class:`Block`), a final norm and the
language-model head (:class:`Head`), whose weight is the token embedding's when tied (GPT-2's
choice). The blocks are the cut points of ``model_parallel`` and pipeline stages and the units
of ``fsdp``; q, k, v, the MLP's first layer (column-wise) and the two output projections
(row-wise) are the layers tensor parallelism shards. Attention infers its local number of
heads from the tensor (``view(B, T, -1, head_dim)``), so a rank holding some of the heads runs
the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gputui.train.moe import MoE


@dataclass(frozen=True)
class GPTShape:
    """The size of a GPT: GPT-2 small is ``GPTShape(50257, 1024, 12, 12, 768)``."""

    vocab_size: int = 256
    context: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    tie: bool = True
    # a mixture of experts in place of each block's MLP (gputui.train.moe); 0 = dense
    moe_experts: int = 0
    moe_top_k: int = 1
    moe_capacity_factor: float = 1.25

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class Embed(nn.Module):
    """Token plus learned position embeddings."""

    cp: Any = None  # context parallelism (gputui.train.context_parallel): the positions held

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.wte = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.wpe = nn.Embedding(shape.context, shape.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = (self.cp.positions(idx) if self.cp is not None
               else torch.arange(idx.shape[1], device=idx.device))
        return self.wte(idx) + self.wpe(pos)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; q, k and v are separate layers so each can be
    sharded column-wise by head."""

    cp: Any = None  # context parallelism (gputui.train.context_parallel): the ring's attention

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.head_dim = shape.head_dim
        self.q = nn.Linear(shape.n_embd, shape.n_embd)
        self.k = nn.Linear(shape.n_embd, shape.n_embd)
        self.v = nn.Linear(shape.n_embd, shape.n_embd)
        self.proj = nn.Linear(shape.n_embd, shape.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = (self.cp.attend(q, k, v) if self.cp is not None
             else F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """Linear to 4x width, GELU, linear back."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.fc = nn.Linear(shape.n_embd, 4 * shape.n_embd)
        self.proj = nn.Linear(4 * shape.n_embd, shape.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.n_embd)
        self.attn = CausalSelfAttention(shape)
        self.ln_2 = nn.LayerNorm(shape.n_embd)
        self.mlp: nn.Module = (MoE(shape.n_embd, shape.moe_experts, shape.moe_top_k,
                                   shape.moe_capacity_factor) if shape.moe_experts else MLP(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Head(nn.Module):
    """The final layer norm and the language-model head (no bias): logits over the vocabulary."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln_f = nn.LayerNorm(shape.n_embd)
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def gpt(shape: GPTShape) -> nn.Sequential:
    """Embed, ``n_layer`` blocks, Head; GPT-2's init (N(0, 0.02), output projections scaled
    by 1/sqrt(2 n_layer)), the head tied to the token embedding when ``shape.tie``. Call under
    a seeded generator for reproducible parameters."""
    model = nn.Sequential(Embed(shape), *(Block(shape) for _ in range(shape.n_layer)),
                          Head(shape))
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            # the experts' projections (experts.proj) as the dense MLP's
            out = name.endswith(("proj.weight", "experts.proj"))
            std = 0.02 / (2 * shape.n_layer) ** 0.5 if out else 0.02
            nn.init.normal_(p, mean=0.0, std=std)
    if shape.tie:
        head, embed = model[-1].lm_head, model[0].wte
        assert isinstance(head, nn.Linear) and isinstance(embed, nn.Embedding)
        head.weight = embed.weight
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, averaged over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
