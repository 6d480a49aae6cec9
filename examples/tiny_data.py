"""A small dataset of your own for gputui: plain torch, generated in memory in milliseconds.

``stripes`` returns (train, test), each (images [N, 1, S, S], labels [N]): four classes of
noisy stripes (horizontal, vertical and the two diagonals). gputui takes the channels, the
image size and the classes from the tensors.
"""

import torch


def _patterns(size: int) -> torch.Tensor:
    i = torch.arange(size).view(-1, 1).float()
    j = torch.arange(size).view(1, -1).float()
    waves = [i + 0 * j, j + 0 * i, i + j, i - j]  # one orientation per class
    return torch.stack([torch.sin(w * 1.6) for w in waves])  # [4, S, S]


def _make(n: int, size: int, noise: float, gen: torch.Generator):
    labels = torch.randint(0, 4, (n,), generator=gen)
    shift = torch.randint(0, size, (n,), generator=gen)
    base = _patterns(size)[labels]
    images = torch.stack([b.roll(int(s), dims=1) for b, s in zip(base, shift)])
    images = images + noise * torch.randn(images.shape, generator=gen)
    return images.unsqueeze(1), labels


def stripes(n_train: int = 2048, n_test: int = 512, size: int = 12, noise: float = 1.5,
            seed: int = 0):
    """The factory gputui calls with data.kwargs: (train, test) tensor pairs."""
    gen = torch.Generator().manual_seed(seed)
    return _make(n_train, size, noise, gen), _make(n_test, size, noise, gen)
