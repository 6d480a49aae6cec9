"""How gputui's training processes wait: OpenMP's ``OMP_WAIT_POLICY`` for every child that
trains or measures (torch-free).

torch's intra-op threads spin at each barrier by default (OpenMP's ACTIVE waiting). On cores
shared with anything else (another user's job, a second rank, the app) a spinning thread
burns the time slice its partner needs, and a one-device baseline comes out several times too
slow (benchmarks/bench_omp_wait.py, 2 cores shared with other work: two ResNet-18 trainers at
once 977 ms a step spinning, 538 ms passive; alone 249 ms spinning, 284 ms passive). So the
children wait passively unless the user chose otherwise: an ``OMP_WAIT_POLICY`` already in
the environment is kept. OpenMP reads it once, when torch loads, so it is set in the parent's
environment before a child is started, and every process below inherits it.
"""

from __future__ import annotations

import os

ENV = "OMP_WAIT_POLICY"
DEFAULT = "PASSIVE"
_OURS = "GPUTUI_OMP_WAIT_DEFAULT"  # set beside it when the value is gputui's, not the user's


def for_children() -> None:
    """Before starting a child that imports torch: OMP_WAIT_POLICY=PASSIVE unless set."""
    if not os.environ.get(ENV):
        os.environ[ENV] = DEFAULT
        os.environ[_OURS] = "1"


def child_policy() -> str:
    """How the children this process starts will wait: "passive", "active", ... (lower case)."""
    return (os.environ.get(ENV) or DEFAULT).strip().lower()


def described() -> str:
    """This process's waiting, as the record keeps it: "passive (gputui's default)",
    "active (OMP_WAIT_POLICY set by the user)", or "active (OpenMP's default: spinning)"."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return "active (OpenMP's default: spinning)"
    if os.environ.get(_OURS) == "1" and value == DEFAULT:
        return "passive (gputui's default)"
    return f"{value.lower()} ({ENV} set by the user)"


def spins(text: str) -> bool:
    """True when a recorded waiting (``described``) spins: active, or OpenMP's default."""
    return text.startswith("active")
