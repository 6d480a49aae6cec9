"""Finding the processes one test started: each test tags its command's environment with a
fresh GPUTUI_TEST_TAG, which every process it starts inherits."""

from __future__ import annotations

import psutil


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes (zombies excluded) whose environment carries ``tag``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("GPUTUI_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out
