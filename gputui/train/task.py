"""What a model's output is scored by: the task (classification or language modelling) and
the loss the model names.

Classification scores a batch by its correct predictions (accuracy); language modelling by
its summed loss (mean loss per token, hence perplexity). A forward may return a tensor or an
object with ``logits`` (a HuggingFace ``ModelOutput``; a tuple's first element likewise), so
a user's transformer trains as is. ``model.loss = "nll"`` is for a model that ends in
``log_softmax`` (its output is already log-probabilities); ``cross_entropy`` takes logits.
Language-model outputs ``[B, T, V]`` are scored against targets ``[B, T]`` position by
position, each example's loss being the mean over its positions, so a batch's mean is the
mean per token (every window has the same length).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from gputui.core.errors import UserError


class OutputShapeError(UserError, ValueError):
    """The model's output does not fit the task: one line, before any step trains."""


def logits_of(out: Any) -> torch.Tensor:
    """The tensor a forward returned: itself, its ``logits`` or a tuple's first element."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model's forward returned a {type(out).__name__}; return a tensor of "
                    f"logits or an object with a .logits tensor")


def output_problem(out: Any, y: torch.Tensor, task: str, classes: int) -> str | None:
    """Why a forward's output cannot be scored against targets ``y`` for ``task`` (one line),
    or None. A language model must give ``[batch, context, vocab]`` for ``[batch, context]``
    targets (torch would fail on another shape with "0D or 1D target tensor expected", or on
    too few logits with "Target 116 is out of bounds", and would train on too many without a
    word); a classifier ``[batch, classes]`` for ``[batch]``."""
    try:
        logits = logits_of(out)
    except TypeError as exc:
        return str(exc)
    got = list(logits.shape)
    if task == "lm":
        want = [*y.shape, classes]
        what = (f"[batch, context, vocab] = {want} (logits for each of the {classes} token "
                f"values at every position)")
    else:
        want = [y.shape[0], classes]
        what = f"[batch, classes] = {want} (a score for each of the {classes} classes)"
    if got == want:
        return None
    return (f"the model's output has shape {got}, and the {'text' if task == 'lm' else 'data'}"
            f" needs {what}; make the model's last layer give that shape")


def loss_function(name: str) -> Callable[..., torch.Tensor]:
    """torch's function for ``model.loss`` (``cross_entropy`` or ``nll``)."""
    return F.nll_loss if name == "nll" else F.cross_entropy


def mean_loss(out: Any, y: torch.Tensor, loss: str = "cross_entropy") -> torch.Tensor:
    """The batch's mean loss (per example for classification, per token for a sequence),
    computed in float32 whatever the autocast dtype of ``out``."""
    logits = logits_of(out).float()
    if logits.dim() > 2 and y.dim() == logits.dim() - 1:  # [B, T, V] against [B, T]
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    return loss_function(loss)(logits, y)


def batch_score(out: Any, y: torch.Tensor, task: str, loss: str = "cross_entropy"
                ) -> torch.Tensor:
    """The batch's summed scores, float64, as ``[score, loss]``: the score is the correct
    predictions (classification) or the sum of each example's mean loss (language modelling);
    the loss is the sum of each example's loss, for either task (for a language model the
    score itself), so the test loss is drawn beside the training loss."""
    logits = logits_of(out)
    if task == "lm":
        per_token = loss_function(loss)(logits.float().reshape(-1, logits.shape[-1]),
                                        y.reshape(-1), reduction="sum")
        total = (per_token / y[0].numel()).double()
        return torch.stack((total, total))
    correct = (logits.argmax(dim=1) == y).sum().double()
    summed = loss_function(loss)(logits.float(), y, reduction="sum").double()
    return torch.stack((correct, summed))


def zero_score(device: torch.device) -> torch.Tensor:
    """Scores at zero on ``device``, ``[score, loss]`` (what evaluation sums from)."""
    return torch.zeros(2, dtype=torch.float64, device=device)
