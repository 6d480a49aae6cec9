"""The device panel shows GPM's SM and tensor activity and the energy used, only where the
GPU gave them (the readings come from the sampler: tests/unit/test_nvml_truth.py)."""

from gputui.core.events import DeviceSample
from gputui.tui.widgets.device_panel import DevicePanel


def test_the_panel_adds_sm_tensor_and_energy_beside_power():
    panel = DevicePanel("cuda:0", "NVIDIA H100")
    base = dict(device="cuda:0", temp_c=60.0, power_w=300.0, power_limit_w=700.0)
    panel.update_sample(DeviceSample(**base, energy_j=5000.0))
    assert panel.extra_text() == "temp 60 °C · power 300 W / 700 W · 0 J"
    panel.update_sample(DeviceSample(**base, energy_j=7500.0, sm_active=71.5,
                                     tensor_active=33.0))
    assert panel.extra_text() == ("temp 60 °C · power 300 W / 700 W · SM 72% · tensor 33% · "
                                  "2.5 kJ")
    panel.update_rate(1500.0)  # the run's samples/s: this GPU's joules per sample
    assert panel.extra_text().endswith("2.5 kJ · 0.2 J/sample")


def test_a_gpu_without_gpm_or_an_energy_counter_shows_neither():
    panel = DevicePanel("cuda:0")
    panel.update_sample(DeviceSample(device="cuda:0", temp_c=50.0, power_w=70.0))
    assert panel.extra_text() == "temp 50 °C · power 70 W"


def test_the_memory_line_sets_the_allocator_peak_against_the_prediction():
    from gputui.core.events import MemoryRow
    from gputui.tui.widgets.hw_figures import memory_text

    row = MemoryRow(device="cuda:0", params=2**20, grads=2**20, optim=2**21,
                    activations=2**22, alloc=2**23, peak=9 * 2**20)
    assert memory_text(row).splitlines()[2] == \
        "torch 8.0 MiB · peak 9.0 MiB vs 8.0 MiB predicted (+1.0 MiB)"
    assert "predicted" not in memory_text(MemoryRow(device="cpu:0", params=1, grads=1, optim=1))
