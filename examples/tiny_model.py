"""A small model of your own for gputui: plain torch, no gputui import.

gputui calls ``build(channels, height, width, classes, **model.kwargs)`` and trains what it
returns. ``TinyNet`` is not an nn.Sequential, so it declares its blocks in forward order
(``gputui_blocks``) for model_parallel to cut between; fsdp can shard each ``Block``
(``strategy.fsdp_wrap = ["Block"]``).
"""

from torch import nn


class Block(nn.Module):
    """conv 3x3, batch norm, ReLU, optionally halving the image."""

    def __init__(self, cin: int, cout: int, pool: bool):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.BatchNorm2d(cout)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x):
        return self.pool(self.norm(self.conv(x)).relu())


class TinyNet(nn.Module):
    """A few conv blocks, global average pooling and a linear head."""

    def __init__(self, channels: int, classes: int, base: int = 16, depth: int = 3):
        super().__init__()
        sizes = [channels] + [base * 2 ** min(i, 2) for i in range(depth)]
        self.blocks = nn.ModuleList(Block(a, b, pool=i < 2)
                                    for i, (a, b) in enumerate(zip(sizes, sizes[1:])))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(sizes[-1], classes))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def gputui_blocks(self):
        """The model's blocks in forward order: running them one after another is forward."""
        return [*self.blocks, self.head]


def build(channels: int, height: int, width: int, classes: int, base: int = 16,
          depth: int = 3) -> nn.Module:
    """The factory gputui calls with the data's shape; base and depth come from model.kwargs."""
    del height, width  # global pooling makes the head independent of the image size
    return TinyNet(channels, classes, base=base, depth=depth)
