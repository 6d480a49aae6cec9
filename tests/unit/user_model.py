"""Models of "the user's own" for the equivalence tests: defined here, outside gputui, and
named to gputui as factories (``path/to/user_model.py:function``), as a user would."""

from __future__ import annotations

from pathlib import Path

from torch import nn

HERE = Path(__file__).resolve()
NET = f"{HERE}:build_net"
SEQUENTIAL = f"{HERE}:build_sequential"


class Block(nn.Module):
    """conv, ReLU, average pooling (no batch norm: chunked pipelines stay exact)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        return self.pool(self.conv(x).relu())


class Net(nn.Module):
    """Not an nn.Sequential: blocks in a ModuleList, a head, and the blocks declared."""

    def __init__(self, channels: int, height: int, width: int, classes: int, hidden: int):
        super().__init__()
        self.blocks = nn.ModuleList([Block(channels, hidden), Block(hidden, hidden)])
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(hidden * (height // 4) * (width // 4),
                                                          classes))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def gputui_blocks(self):
        return [*self.blocks, self.head]


def build_net(channels: int, height: int, width: int, classes: int, hidden: int = 8) -> Net:
    return Net(channels, height, width, classes, hidden)


def build_sequential(channels: int, height: int, width: int, classes: int) -> nn.Sequential:
    return nn.Sequential(Block(channels, 6), Block(6, 6), nn.Flatten(),
                         nn.Linear(6 * (height // 4) * (width // 4), classes))
