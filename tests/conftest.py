"""Shared fixtures: paths, and a clean runs folder per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# OpenMP threads that wait passively (sleep) instead of spinning. torch's intra-op threads spin
# at every barrier by default; when anything else shares the cores (a second pytest worker, a
# run's ranks, the app's thread) a spinning thread burns the time slice its partner needs:
# ResNet-18 steps on 2 quiet cores: 3.2 s with two such processes at once against 0.45 s passive
# (0.23 s alone, 0.26 s alone and passive; benchmarks/bench_omp_wait.py). Set before torch loads here, inherited by
# every process a test starts; timings are never asserted, so only the suite's time changes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
GPUTUI = [sys.executable, "-m", "gputui"]


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    """Every test writes run records under its own temp folder, never ./runs."""
    monkeypatch.setenv("GPUTUI_RUNS_DIR", str(tmp_path / "runs"))


def pytest_collection_modifyitems(config, items):
    """Files with the most training processes first; skip tests marked gpu on machines
    without CUDA (checked through NVML, not torch)."""
    _heaviest_files_first(items)
    from gputui.hw.discovery import discover_gpus

    gpus, reason = discover_gpus()
    if gpus:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _heaviest_files_first(items) -> None:
    """Order the files by how many of their tests start training processes (the ``slow``
    mark), most first, keeping each file's own order. The README's command hands whole files
    to pytest-xdist's workers in this order: a long file started last would leave the other
    workers idle at the end. Every worker collects the same order (it depends only on the
    items)."""
    def file_of(item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}
    for item in items:
        slow[file_of(item)] = slow.get(file_of(item), 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda it: -slow[file_of(it)])  # stable: files and tests keep their order


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
