"""GPU truth through the fake NVML at the boundary: the energy counter, GPM's SM and tensor
activity (only where the GPU supports GPM), and the links between two GPUs; each reading
absent where the GPU or driver lacks it."""

from __future__ import annotations

import pytest

from fakes.nvml import FakeGpu, FakeNvml
from gputui.core.devices import Device
from gputui.hw import nvml
from gputui.hw.sampler import Sampler

A, B = "00000000:1A:00.0", "00000000:3B:00.0"


@pytest.fixture
def fake():
    hopper = FakeGpu("NVIDIA H100", "GPU-aaaa", A, energy_mj=5_000_000,
                     gpm={2: 71.5, 3: 40.0, 5: 33.25}, nvlinks=[B, B, ""],
                     topology={B: 50})
    old = FakeGpu("NVIDIA T4", "GPU-bbbb", B, energy_mj=None, topology={A: 50})
    mod = FakeNvml([hopper, old])
    nvml.use_module(mod)
    yield mod, hopper, old
    nvml.use_module(None)


def test_the_sampler_reads_energy_and_gpm_where_the_gpu_has_them(fake, monkeypatch):
    mod, hopper, _ = fake
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = Sampler([Device("cuda", 0), Device("cuda", 1)], 0.25, emit=lambda _: None, host=False)
    first, old = s.sample_once()
    assert first.energy_j == pytest.approx(5000.0) and first.sm_active is None  # GPM: 2 samples
    assert old.energy_j is None and old.sm_active is None  # no counter, no GPM on this GPU
    hopper.energy_mj += 1500
    second, old = s.sample_once()
    assert second.energy_j == pytest.approx(5001.5)
    assert (second.sm_active, second.sm_occupancy, second.tensor_active) == (71.5, 40.0, 33.2)
    assert old.tensor_active is None
    s.stop()
    assert mod.gpm_live == 0  # every GPM sample NVML allocated was freed


def test_gpm_metrics_a_gpu_does_not_give_are_left_out(fake):
    _, hopper, _ = fake
    hopper.gpm = {2: 10.0}  # SM active only
    h = nvml.handle("GPU-aaaa")
    a, b = nvml.gpm_sample(h), nvml.gpm_sample(h)
    assert nvml.gpm_metrics(a, b) == {"sm_active": 10.0}
    nvml.gpm_free(a)
    nvml.gpm_free(b)


def test_links_count_active_nvlinks_and_name_the_pcie_path(fake):
    ha, hb = nvml.handle("GPU-aaaa"), nvml.handle("GPU-bbbb")
    assert nvml.link(ha, hb, B) == (2, "across CPU sockets")
    assert nvml.link(hb, ha, A) == (0, "across CPU sockets")  # T4: no NVLink at all


def test_without_a_driver_every_reading_is_absent():
    nvml.use_module(FakeNvml([], init_error=FakeNvml.NVMLError_DriverNotLoaded))
    try:
        assert nvml.energy_mj(object()) is None and not nvml.gpm_supported(object())
        assert nvml.link(object(), object(), A) == (0, None)
    finally:
        nvml.use_module(None)
