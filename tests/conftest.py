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
    from gputui.hw.discovery import discover_gpus

    gpus, reason = discover_gpus()
    if gpus:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_gpus(monkeypatch):
    """``fake_gpus(n)``: this process sees n GPUs through a fake pynvml (0 = a machine without
    a GPU: the driver is not loaded), whatever the machine really has; the real NVML comes
    back afterwards. CUDA_VISIBLE_DEVICES is cleared so the fake's order is the CUDA order."""
    from gputui.hw import nvml
    from fakes.nvml import FakeGpu, FakeNvml

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(n: int, name: str = "NVIDIA H100 80GB HBM3"):
        if n == 0:
            mod = FakeNvml([], init_error=FakeNvml.NVMLError_DriverNotLoaded)
        else:
            mod = FakeNvml([FakeGpu(name, f"GPU-{i:04d}-fake", f"00000000:{16 + i:02X}:00.0",
                                    mem_total=80 * 1024**3) for i in range(n)])
        nvml.use_module(mod)
        return mod

    yield install
    nvml.use_module(None)
