"""The embedded default dataset: ten classes of seven-segment glyphs, drawn at random.

Each 28x28 grayscale image draws the glyph of its class (the segments of a digit on a
seven-segment display) with random scale, rotation, shear, position, stroke width, jittered
end points, a distractor stroke, noise and a random overall brightness. The brightness is
rescaled per image to a mean drawn from one range for every class, so mean brightness (or
"how much ink") says nothing about the class: a model must learn shapes. Generation is
deterministic: the same (size, seed) always gives the same tensors.
"""

from __future__ import annotations

import math

import torch

# Segment end points in a unit glyph box (x right, y down), seven-segment naming a..g.
_SEGMENTS = {
    "a": (-0.5, -1.0, 0.5, -1.0), "b": (0.5, -1.0, 0.5, 0.0), "c": (0.5, 0.0, 0.5, 1.0),
    "d": (-0.5, 1.0, 0.5, 1.0), "e": (-0.5, 0.0, -0.5, 1.0), "f": (-0.5, -1.0, -0.5, 0.0),
    "g": (-0.5, 0.0, 0.5, 0.0),
}
_DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg",
           "abcdfg"]
SIDE = 28
NUM_CLASSES = 10
MAX_SEGS = 8  # seven slots (glyph segments, the rest short distractors) plus one extra


def _class_table() -> tuple[torch.Tensor, torch.Tensor]:
    segs = torch.zeros(NUM_CLASSES, MAX_SEGS, 4)
    mask = torch.zeros(NUM_CLASSES, MAX_SEGS, dtype=torch.bool)
    for c, letters in enumerate(_DIGITS):
        for j, letter in enumerate(letters):
            segs[c, j] = torch.tensor(_SEGMENTS[letter])
            mask[c, j] = True
    return segs, mask


def _render(segs: torch.Tensor, mask: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """Stroke intensity of each pixel: a Gaussian profile of the distance to the nearest segment."""
    coords = torch.arange(SIDE, dtype=torch.float32) + 0.5
    py = coords.repeat_interleave(SIDE)  # row-major pixel centres, [P]
    px = coords.repeat(SIDE)
    # Absent segments are moved far off the canvas instead of masked, to save a pass.
    segs = torch.where(mask[..., None], segs, torch.full_like(segs, -1e3))
    ax, ay, bx, by = (segs[..., i, None] for i in range(4))  # [N, S, 1]
    abx, aby = bx - ax, by - ay
    inv = 1.0 / (abx * abx + aby * aby).clamp_min(1e-6)
    dx, dy = px - ax, py - ay  # [N, S, P]
    t = ((dx * abx + dy * aby) * inv).clamp_(0, 1)
    dx.sub_(t * abx)
    dy.sub_(t * aby)
    d2 = (dx.mul_(dx).add_(dy.mul_(dy))).min(dim=1).values  # [N, P]
    ink = torch.exp(-d2 / (2 * width[:, None] ** 2))
    return ink.reshape(-1, SIDE, SIDE)


def generate(n: int, seed: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images [n, 1, 28, 28] in [0, 1] and labels [n], balanced over the ten classes."""
    gen = torch.Generator().manual_seed(seed)
    table, table_mask = _class_table()
    labels = torch.arange(n) % NUM_CLASSES
    labels = labels[torch.randperm(n, generator=gen)]
    images = torch.empty(n, 1, SIDE, SIDE)
    for start in range(0, n, chunk):
        y = labels[start:start + chunk]
        images[start:start + len(y), 0] = _draw(y, table, table_mask, gen)
    return images, labels


def _uniform(gen: torch.Generator, shape: tuple, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


def _draw(y: torch.Tensor, table: torch.Tensor, table_mask: torch.Tensor,
          gen: torch.Generator) -> torch.Tensor:
    m = len(y)
    segs = table[y].clone()  # [m, S, 4]
    mask = table_mask[y].clone()
    segs = segs + _uniform(gen, segs.shape, -0.12, 0.12)  # jittered end points
    # Random affine: scale, rotation, shear, then position around the centre.
    scale = _uniform(gen, (m, 1), 6.0, 9.0)
    aspect = _uniform(gen, (m, 1), 0.8, 1.3)
    angle = _uniform(gen, (m, 1), -0.2, 0.2)
    shear = _uniform(gen, (m, 1), -0.2, 0.2)
    shift = _uniform(gen, (m, 2), -4.0, 4.0) + SIDE / 2
    pts = segs.reshape(m, MAX_SEGS * 2, 2)
    x = pts[..., 0] * scale * aspect + pts[..., 1] * shear * scale
    yv = pts[..., 1] * scale
    cos, sin = torch.cos(angle), torch.sin(angle)
    pts = torch.stack([cos * x - sin * yv + shift[:, :1], sin * x + cos * yv + shift[:, 1:]], -1)
    segs = pts.reshape(m, MAX_SEGS, 4)
    # Unused glyph slots get short distractor strokes, so every image has seven strokes and
    # the amount of ink hardly depends on the class; the last slot adds one more at random.
    centre = _uniform(gen, (m, MAX_SEGS, 2), 3.0, SIDE - 3.0)
    theta = _uniform(gen, (m, MAX_SEGS, 1), 0.0, math.pi)
    half = _uniform(gen, (m, MAX_SEGS, 1), 0.75, 1.75)
    direction = torch.cat([torch.cos(theta), torch.sin(theta)], -1) * half
    distractors = torch.cat([centre - direction, centre + direction], -1)
    segs = torch.where(mask[..., None], segs, distractors)
    mask = torch.ones_like(mask)
    mask[:, -1] = torch.rand(m, generator=gen) < 0.5
    width = _uniform(gen, (m,), 0.7, 1.5)
    ink = _render(segs, mask, width)
    ink = ink + 0.05 * torch.randn(ink.shape, generator=gen)
    # Mean brightness drawn from one range for all classes: ink quantity carries no label.
    target = _uniform(gen, (m, 1, 1), 0.10, 0.22)
    ink = ink.clamp_min(0)
    ink = ink * (target / ink.mean(dim=(1, 2), keepdim=True).clamp_min(1e-3))
    return ink.clamp(0.0, 1.0)
