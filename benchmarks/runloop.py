"""What the run benchmarks share (bench_cp, bench_ep, bench_mesh): one run through the
launcher, kept to its steady steps (those after the first epoch) and its first memory report,
and the largest rank's figure of that report."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputui.core.events import MemoryRow, StepMetrics  # noqa: E402
from gputui.runs.launcher import launch  # noqa: E402


def steady_run(cfg, prefix: str) -> tuple[list[StepMetrics], list[MemoryRow]]:
    """Run ``cfg`` in a temp folder named ``prefix``; its steps after the first epoch and the
    rows of its first memory report. A failed run, or one with no step after its first epoch,
    ends the benchmark with one line."""
    # the run's record, then gone (a failed run's files may still be written as it ends)
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as runs:
        return _steady(launch(cfg, runs), cfg)


def _steady(handle, cfg) -> tuple[list[StepMetrics], list[MemoryRow]]:
    steps: list[StepMetrics] = []
    memory: list[MemoryRow] | None = None
    first_epoch_done = False
    while not handle.done:
        for ev in handle.poll(timeout=0.2):
            if ev.kind == "epoch_end":
                first_epoch_done = True
            elif ev.kind == "step" and first_epoch_done:
                steps.append(ev)
            elif ev.kind == "memory" and memory is None:
                memory = list(ev.per_device)
            elif ev.kind == "run_failed":
                raise SystemExit(f"{cfg.strategy.name} run failed: {ev.reason}")
    if not steps:
        raise SystemExit(f"{cfg.strategy.name}: no steps after the first epoch; raise --epochs")
    return steps, memory or []


def largest(rows: list[MemoryRow], key: str) -> int | None:
    """The largest rank's ``key`` (params, grads, optim, experts, activations), None unless
    every rank has it."""
    values = [getattr(r, key) for r in rows]
    return max(values) if values and all(v is not None for v in values) else None


def mib(n: int | None) -> str:
    return f"{n / 2**20:7.2f}" if n is not None else "    n/a"
