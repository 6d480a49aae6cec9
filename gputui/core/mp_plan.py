"""Where ``model_parallel`` cuts a model into stages: balancing and checking split points.

Torch-free on purpose: ``gputui.plan`` (and through it the CLI and the TUI) checks a preset's
``strategy.split_points`` before any training process starts. A stage is a run of the model's
top-level blocks (``models.py`` builds every model as an ``nn.Sequential`` of coarse blocks);
a split point is the index of the block where a new stage starts.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gputui.core.config import RunConfig

# Top-level blocks of each model in gputui.train.models (a unit test keeps these in step).
MODEL_LAYERS = {"lenet": 4, "resnet18": 6, "mlp": 3}


def model_layers(cfg: "RunConfig") -> int | None:
    """Top-level blocks of the built-in model the config names (gpt: embedding, n_layer
    blocks, head); None for a model.factory."""
    if cfg.model.factory:
        return None
    if cfg.model.name == "gpt":
        return cfg.model.n_layer + 2
    return MODEL_LAYERS.get(cfg.model.name)


def balance(counts: list[int], n: int) -> list[int]:
    """Split points cutting layers with ``counts`` parameters into ``n`` consecutive non-empty
    stages so that the largest stage holds as few parameters as possible (the linear partition
    problem, solved exactly by dynamic programming; ties go to the earliest cut)."""
    layers = len(counts)
    if not 1 <= n <= layers:
        raise ValueError(f"cannot cut {layers} layers into {n} non-empty stages")
    prefix = [0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest possible largest stage when the first i layers form j stages.
    best = [[inf] * (layers + 1) for _ in range(n + 1)]
    cut = [[0] * (layers + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for j in range(1, n + 1):
        for i in range(j, layers + 1):
            for a in range(j - 1, i):
                cost = max(best[j - 1][a], prefix[i] - prefix[a])
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, a
    points, i = [], layers
    for j in range(n, 1, -1):
        i = cut[j][i]
        points.append(i)
    return points[::-1]


def check_split_points(points: list, n_layers: int, n_devices: int,
                       model: str = "the model") -> str | None:
    """None when ``points`` are valid split points for this many layers and devices, else a
    one-line reason with the fix. An empty list means 'balance by parameter count'."""
    if not points:
        return None
    if any(isinstance(p, bool) or not isinstance(p, int) for p in points):
        return f"strategy.split_points must be whole numbers (layer indices), got {points!r}"
    if len(points) != n_devices - 1:
        return (f"strategy.split_points has {len(points)} entries for {n_devices} devices; "
                f"give {n_devices - 1} (devices - 1), or [] to balance by parameter count")
    if any(b <= a for a, b in pairwise(points)):
        return f"strategy.split_points must be strictly increasing, got {points!r}"
    if points[0] < 1 or points[-1] > n_layers - 1:
        return (f"strategy.split_points must lie between 1 and {n_layers - 1} ({model} has "
                f"{n_layers} layers), got {points!r}")
    return None
