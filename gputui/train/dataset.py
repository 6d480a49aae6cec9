"""The in-memory dataset every strategy trains on, and the error a dataset that cannot be read
raises. A leaf: the built-in sets (``data``) and the user's own (``userdata``) both build it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gputui.core.errors import UserError


class DataError(UserError, RuntimeError):
    """A dataset that cannot be read or fetched; the message is one line for the user."""


@dataclass
class Dataset:
    """Train and test tensors: images (standardised with the training set's mean and std)
    and labels, or for ``task = "lm"`` windows of byte tokens and their next tokens
    (``gputui.train.text``; ``num_classes`` is then the vocabulary and ``baseline`` the
    unigram entropy of the training split, in nats)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int = 10
    task: str = "classify"  # or "lm"
    baseline: float | None = None  # lm: the unigram loss a model must beat
    source: str = ""  # lm: what text it is (said once in the run's log)

    # A text window is [context] tokens: one channel, one row, context wide.
    @property
    def in_channels(self) -> int:
        return 1 if self.task == "lm" else int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])

    @property
    def height(self) -> int:
        return 1 if self.task == "lm" else int(self.train_x.shape[-2])

    @property
    def n_train(self) -> int:
        return len(self.train_x)

    @property
    def n_test(self) -> int:
        return len(self.test_x)
