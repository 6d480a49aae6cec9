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


def test_a_gpu_without_gpm_or_an_energy_counter_shows_neither():
    panel = DevicePanel("cuda:0")
    panel.update_sample(DeviceSample(device="cuda:0", temp_c=50.0, power_w=70.0))
    assert panel.extra_text() == "temp 50 °C · power 70 W"
