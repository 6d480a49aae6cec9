"""Language models "of the user's own" for the LM tests, named to gputui as factories
(``path/to/user_lm.py:function``). For text data a factory is called as
``function(1, 1, context, vocab, **model.kwargs)``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve()
LOG_SOFTMAX = f"{HERE}:build_log_softmax"
OUTPUT_OBJECT = f"{HERE}:build_output_object"
HF_GPT2 = f"{HERE}:build_hf_gpt2"
TRANSFORMER = f"{HERE}:build_transformer"  # a ModuleList of nn.MultiheadAttention blocks


class Bigram(nn.Module):
    """Each byte's embedding, a linear map to the vocabulary."""

    def __init__(self, vocab: int, width: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(idx))


class LogSoftmaxLM(Bigram):
    """Ends in log_softmax: trained with model.loss = "nll"."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(super().forward(idx), dim=-1)


@dataclass
class Output:
    """What a HuggingFace model returns, in miniature: logits and an optional loss."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class ObjectLM(Bigram):
    def forward(self, idx: torch.Tensor) -> Output:
        return Output(logits=super().forward(idx))


def build_log_softmax(channels: int, height: int, width: int, classes: int) -> nn.Module:
    return LogSoftmaxLM(classes)


def build_output_object(channels: int, height: int, width: int, classes: int) -> nn.Module:
    return ObjectLM(classes)


def hide_broken_torchvision() -> None:
    """The development machines' torchvision is a CUDA build that fails to import beside the
    CPU torch (see DESIGN.md); transformers imports it for its image utilities whenever it is
    installed. Where it cannot import, tell transformers it is absent (a GPU machine's
    matching torchvision imports and is left alone)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure: treat it as not installed
        import transformers.utils as utils
        import transformers.utils.import_utils as import_utils

        utils.is_torchvision_available = import_utils.is_torchvision_available = lambda: False


def build_hf_gpt2(channels: int, height: int, width: int, classes: int, n_embd: int = 32,
                  n_layer: int = 2, n_head: int = 2) -> nn.Module:
    """A randomly initialised transformers.GPT2LMHeadModel (no weights downloaded)."""
    hide_broken_torchvision()
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=classes, n_positions=width, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


class AttentionBlock(nn.Module):
    """A pre-norm block on torch's own nn.MultiheadAttention (causal) and an MLP: what a user
    writes first. Its key bias has a gradient of zero in exact arithmetic (a softmax ignores
    a shift of every score), so in float32 a gradient of rounding alone."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    """A plain nn.Module: embeddings, a ModuleList of blocks, a head of ``out`` logits."""

    def __init__(self, context: int, vocab: int, width: int = 32, heads: int = 2,
                 layers: int = 2, out: int | None = None):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(AttentionBlock(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, out or vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class LastOnlyLM(TransformerLM):
    """The wrong shape: one prediction per window ([batch, vocab]), not one per position."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx)[:, -1]


def build_transformer(channels: int, height: int, context: int, vocab: int,
                      **kw) -> nn.Module:
    return TransformerLM(context, vocab, **kw)


def build_wrong_vocab(channels: int, height: int, context: int, vocab: int,
                      out: int = 300) -> nn.Module:
    """Logits for ``out`` tokens where the data has ``vocab`` (300 for 256 byte values)."""
    return TransformerLM(context, vocab, out=out)


def build_last_only(channels: int, height: int, context: int, vocab: int) -> nn.Module:
    return LastOnlyLM(context, vocab)
