"""A measurement's machine state, as recorded (torch-free, hardware-free): whether it was
contended and the one line that says so. Measured by :mod:`gputui.hw.contention`; a run's is
``machine.json`` beside its summary.
"""

from __future__ import annotations

import json
from pathlib import Path

FILE = "machine.json"  # a run's machine state, beside its summary
CONTENDED = 0.10  # others' share of all the cores from which a figure is marked contended


def note(state: dict | None) -> str:
    """One line naming the contention ("" when the machine was quiet or not recorded)."""
    if not state or not state.get("contended"):
        return ""
    parts = []
    if (state.get("others_share") or 0) >= CONTENDED:
        parts.append(f"other processes used {state['others_share']:.0%} of the "
                     f"{state.get('cores')} cores (load {state.get('load_end')})")
    others = state.get("gpu_others") or []
    if others:
        names = ", ".join(f"{o.get('name') or 'pid'} {o.get('pid')}" for o in others[:3])
        parts.append(f"other processes on the GPU: {names}")
    return "contended: " + "; ".join(parts)


def read(folder) -> dict | None:
    """A record's machine state (``machine.json``), None when not recorded."""
    try:
        data = json.loads((Path(folder) / FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
