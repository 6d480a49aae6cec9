"""Shared fixtures: paths, and a clean runs folder per test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
GPUTUI = [sys.executable, "-m", "gputui"]


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    """Every test writes run records under its own temp folder, never ./runs."""
    monkeypatch.setenv("GPUTUI_RUNS_DIR", str(tmp_path / "runs"))


def pytest_collection_modifyitems(config, items):
    """Skip tests marked gpu on machines without CUDA (checked through NVML, not torch)."""
    from gputui.devices import discover_gpus

    gpus, reason = discover_gpus()
    if gpus:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
