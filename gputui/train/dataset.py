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
    """Train and test tensors (standardised with the training set's mean and std)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int = 10

    @property
    def in_channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])

    @property
    def height(self) -> int:
        return int(self.train_x.shape[-2])

    @property
    def n_train(self) -> int:
        return len(self.train_x)

    @property
    def n_test(self) -> int:
        return len(self.test_x)
