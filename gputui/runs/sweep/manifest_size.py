"""How large a sweep may grow: every bound derived from the one size its manifest is read at.

``sweep --resume`` and ``compare --sweep`` read a manifest only up to :data:`MANIFEST_LIMIT`
(a file larger than that is refused, as every record file beyond its bound is). So a sweep is
refused where its size is given (``--repeat``, ``--devices``, the axes, ``--set``) whenever its
manifest could outgrow that: the sweep's own parameters get :data:`HEADER_BYTES`, each point at
most :data:`POINT_BYTES` (a long failure reason or a long list of other GPU processes is
shortened to fit when the point is saved; the run's own record keeps them whole), which makes
:data:`MAX_POINTS`. Torch-free.
"""

from __future__ import annotations

import json
from math import prod
from typing import Any

MANIFEST_LIMIT = 4 << 20  # the bytes load_manifest reads; the only number the others follow
HEADER_BYTES = 64 << 10  # the sweep's parameters: preset path, --set values, device counts
POINT_BYTES = 2 << 10  # one point's entry, as saved (indented) in the manifest
MAX_POINTS = (MANIFEST_LIMIT - HEADER_BYTES) // POINT_BYTES
INDENT = 2  # the manifest's json indent
_MORE = " ... (shortened here; the run's record holds it whole)"


def max_repeat(grid: int) -> int:
    """The most passes ``--repeat`` may make over a grid of ``grid`` points."""
    return MAX_POINTS // max(1, grid)


def grid_problem(repeat: int, devices: list, strategies: list, axes: dict) -> str | None:
    """Why a sweep of this shape could not be resumed (one line naming the flag), or None."""
    sizes = [len(devices), len(strategies), *(len(v) for v in axes.values())]
    grid = prod(sizes)
    if grid > MAX_POINTS:
        shape = " x ".join(str(n) for n in sizes)
        return (f"--devices, --strategies and the axes make a grid of {shape} = {grid} points; "
                f"a sweep holds at most {MAX_POINTS} (its manifest must stay readable by "
                f"--resume and compare --sweep); split it into several sweeps")
    if repeat * grid > MAX_POINTS:
        return (f"--repeat {repeat}: {repeat} passes over the grid of {grid} point"
                f"{'s' if grid != 1 else ''} make {repeat * grid} runs; a sweep holds at most "
                f"{MAX_POINTS} (its manifest must stay readable by --resume and compare "
                f"--sweep); give --repeat {max_repeat(grid)} or less")
    return None


def header_problem(header: dict[str, Any]) -> str | None:
    """Why the sweep's parameters (its manifest without points) are too large, or None."""
    size = len(json.dumps(header, indent=INDENT))
    if size > HEADER_BYTES:
        return (f"--set and the sweep's other parameters take {size // 1024} KiB; a sweep's "
                f"manifest gives them at most {HEADER_BYTES // 1024} KiB; shorten the --set "
                f"values (or put them in a preset file)")
    return None


def point_bytes(point: dict[str, Any]) -> int:
    """What ``point`` takes in the manifest: indented as a list item, with its separator."""
    return len(json.dumps(point, indent=INDENT)) + _DEPTH * point_lines(point) + 2


def point_lines(point: dict[str, Any]) -> int:
    return json.dumps(point, indent=INDENT).count("\n") + 1


_DEPTH = 2 * INDENT  # a point is indented twice in the manifest (its "points" list)


def fit_point(point: dict[str, Any]) -> dict[str, Any]:
    """``point`` (a Point as a dict), shortened until it takes at most POINT_BYTES: first the
    other GPU processes beyond three, then the reason, cut at a word with a note that the
    run's record holds it whole."""
    if point_bytes(point) <= POINT_BYTES:
        return point
    point = dict(point)
    machine = dict(point.get("machine") or {})
    others = machine.get("gpu_others")
    if isinstance(others, list) and len(others) > 3:
        machine["gpu_others"] = others[:3]
        point["machine"] = machine
    reason = str(point.get("reason") or "")
    while reason and (size := point_bytes(point)) > POINT_BYTES:
        over = size - POINT_BYTES
        encoded = len(json.dumps(reason)) - 2  # escapes make a character up to 12 bytes
        keep = max(0, len(reason) * (encoded - over - len(_MORE)) // max(1, encoded) - 8)
        head = reason[:keep]
        reason = head.rsplit(" ", 1)[0] if " " in head else head
        point["reason"] = reason + _MORE if reason else ""
    if point_bytes(point) > POINT_BYTES:  # what is left is the machine state: keep its note
        point["machine"] = {k: machine[k] for k in ("contended", "note") if k in machine}
    return point
