"""The NVML entry point against a fake pynvml: values, errors, no driver, CUDA renumbering."""

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gputui.core.devices import DeviceSpecError, no_gpu_sentence
from gputui.hw import nvml
from gputui.hw.discovery import discover_gpus, resolve_devices
from fakes.nvml import FakeGpu, FakeNvml

NO_DRIVER = "no NVIDIA driver is installed: libnvidia-ml.so.1 was not found"


@pytest.fixture
def fake():
    """Install a FakeNvml over the given GPUs; the real module comes back afterwards."""
    def install(gpus, **kw):
        mod = FakeNvml(gpus, **kw)
        nvml.use_module(mod)
        return mod
    yield install
    nvml.use_module(None)


def three_gpus():
    # NVML order A, B, C; PCI order (which CUDA ordinals follow here) is A, B, C too.
    return [FakeGpu("NVIDIA A100", "GPU-aaaa-0001", "00000000:1A:00.0", util=10, temp=31),
            FakeGpu("NVIDIA A100", "GPU-bbbb-0002", "00000000:3B:00.0", util=20, temp=32),
            FakeGpu("NVIDIA T4", "GPU-cccc-0003", "00000000:86:00.0", util=30, temp=33,
                    mem_total=15 * 1024**3, mem_used=5 * 1024**3, power_mw=70_123,
                    limit_mw=70_000)]


def test_readings_convert_units(fake):
    fake(three_gpus())
    gpus, reason = nvml.cuda_gpus(env={})
    assert reason == ""
    t4 = gpus[2]
    assert (t4.index, t4.name, t4.uuid, t4.nvml_index, t4.pci_bus_id) == \
        (2, "NVIDIA T4", "GPU-cccc-0003", 2, "00000000:86:00.0")
    assert (t4.util, t4.temp_c, t4.mem_used, t4.mem_total) == \
        (30.0, 33.0, 5 * 1024**3, 15 * 1024**3)
    assert t4.power_w == pytest.approx(70.123) and t4.power_limit_w == pytest.approx(70.0)
    assert nvml.driver_version() == "575.57.08"


def test_unsupported_and_lost_values_are_none_not_errors(fake):
    gpus = three_gpus()
    gpus[0].temp = None  # NotSupported, as on many passively cooled boards
    gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"}
    gpus[1].lost = True  # NVMLError_GpuIsLost from every call
    fake(gpus)
    got, _ = nvml.cuda_gpus(env={})
    first = got[0]
    assert (first.temp_c, first.power_w, first.power_limit_w) == (None, None, None)
    assert first.util == 10.0 and first.mem_total == 16 * 1024**3
    # The lost GPU's UUID cannot be read, so it cannot be matched to a CUDA ordinal.
    assert [g.uuid for g in got] == ["GPU-aaaa-0001", "GPU-cccc-0003"]
    pci = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert nvml.order(env=pci).notes == ["NVML device 1 did not report its UUID (lost or not "
                                         "queryable), so it is left out"]
    h = nvml.handle("GPU-bbbb-0002")
    assert h is not None and nvml.read(h) == nvml.GpuReading()
    assert nvml.call("nvmlDeviceGetSomethingNew", h) is None  # older bindings lack it


def test_bytes_from_old_bindings_become_str(fake):
    fake(three_gpus(), as_bytes=True)
    gpus, _ = nvml.cuda_gpus(env={})
    assert [g.name for g in gpus] == ["NVIDIA A100", "NVIDIA A100", "NVIDIA T4"]
    assert gpus[0].uuid == "GPU-aaaa-0001" and gpus[0].pci_bus_id == "00000000:1A:00.0"
    assert nvml.driver_version() == "575.57.08"


def test_init_is_lazy_once_and_shutdown_is_clean(fake):
    mod = fake(three_gpus())
    assert mod.init_calls == 0  # nothing happens until a value is wanted
    nvml.cuda_gpus(env={})
    nvml.cuda_gpus(env={})
    assert (mod.init_calls, mod.initialised) == (1, 1)
    nvml.shutdown()
    assert mod.initialised == 0
    nvml.cuda_gpus(env={})  # a later call starts NVML again
    assert (mod.init_calls, mod.initialised) == (2, 1)


def test_atexit_shuts_nvml_down():
    code = textwrap.dedent("""
        import atexit
        from gputui.hw import nvml
        from fakes.nvml import FakeGpu, FakeNvml
        mod = FakeNvml([FakeGpu()])
        # Registered first, so it runs after nvml's own exit handler.
        atexit.register(lambda: print("initialised at exit:", mod.initialised))
        nvml.use_module(mod)
        print("gpus:", len(nvml.cuda_gpus(env={})[0]), "initialised:", mod.initialised)
    """)
    tests_dir = str(Path(__file__).resolve().parents[1])  # where the fakes package lives
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True, env=env).stdout.split("\n")
    assert out[:2] == ["gpus: 1 initialised: 1", "initialised at exit: 0"]


@pytest.mark.parametrize("error, reason", [
    ("NVMLError_LibraryNotFound", NO_DRIVER),
    ("NVMLError_DriverNotLoaded", "the NVIDIA kernel driver is not loaded"),
    ("NVMLError_NoPermission", "this user is not allowed to query the NVIDIA driver"),
    ("NVMLError_Unknown", "NVML could not start: Unknown"),
])
def test_absent_driver_gives_one_sentence(fake, error, reason):
    fake([], init_error=getattr(FakeNvml, error))
    assert discover_gpus() == ([], reason)
    assert no_gpu_sentence(reason) == (f"No GPU is listed because {reason}; CPU virtual "
                                       f"devices (cpu, cpu*N) are used instead.")
    assert nvml.read(object()) == nvml.GpuReading()  # no raise without a driver either
    with pytest.raises(DeviceSpecError) as err:
        resolve_devices("all")
    assert str(err.value) == f"'all' selects GPUs but none is available ({reason}); " \
                             f"use cpu or cpu*N"
    assert [d.name for d in resolve_devices("2", fallback="cpu")] == ["cpu:0", "cpu:1"]


def test_driver_without_gpus(fake):
    fake([])
    assert nvml.cuda_gpus(env={}) == ([], "the NVIDIA driver is loaded but reports no GPU")


def test_real_pynvml_here_reports_the_missing_driver():
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    nvml.use_module(None)
    assert nvml.cuda_gpus() == ([], NO_DRIVER)


def test_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    nvml.use_module(None)
    try:
        assert nvml.cuda_gpus() == ([], "the nvidia-ml-py package that provides pynvml is "
                                        "not installed")
    finally:
        monkeypatch.undo()
        nvml.use_module(None)


def test_cuda_visible_devices_reorders_by_uuid(fake, monkeypatch):
    fake(three_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus, reason = discover_gpus()
    assert reason == ""
    assert [(g.index, g.nvml_index, g.uuid) for g in gpus] == \
        [(0, 2, "GPU-cccc-0003"), (1, 0, "GPU-aaaa-0001")]
    # The live figures come from the matched device, not from NVML index 0 and 1.
    assert [(g.util, g.temp_c, g.name) for g in gpus] == \
        [(30.0, 33.0, "NVIDIA T4"), (10.0, 31.0, "NVIDIA A100")]
    assert [d.label for d in resolve_devices("0")] == ["NVIDIA T4"]


def test_uuid_prefixes_and_pci_order_differing_from_nvml_order(fake):
    gpus = three_gpus()
    gpus[0].bus_id, gpus[2].bus_id = gpus[2].bus_id, gpus[0].bus_id  # NVML 0 sits at bus 86
    fake(gpus)
    got, _ = nvml.cuda_gpus(env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [g.nvml_index for g in got] == [2, 1, 0]
    got, _ = nvml.cuda_gpus(env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa-0001"})
    assert [(g.index, g.uuid, g.util) for g in got] == \
        [(0, "GPU-bbbb-0002", 20.0), (1, "GPU-aaaa-0001", 10.0)]
    assert nvml.cuda_gpus(env={"CUDA_VISIBLE_DEVICES": "-1"}) == \
        ([], "CUDA_VISIBLE_DEVICES='-1' hides all 3 GPU(s) of this machine")


def test_processes_make_a_gpu_busy(fake):
    gpus = three_gpus()
    gpus[1].processes = [(os.getpid(), 512 * 1024**2), (2**22 + 12345, None)]
    fake(gpus)
    got, _ = nvml.cuda_gpus(env={})
    assert [g.busy for g in got] == [False, True, False]
    mine, ghost = got[1].processes
    assert (mine.pid, mine.used_mem) == (os.getpid(), 512 * 1024**2)
    assert mine.name  # this test's own process has a readable name
    assert (ghost.used_mem, ghost.name) == (None, "")  # gone, or another pid namespace


def test_mig_devices_are_cuda_devices(fake):
    gpus = three_gpus()
    gpus[2].migs = [FakeGpu("NVIDIA T4 MIG 1g", "MIG-1111", gi=1, ci=0, mem_total=2**30),
                    FakeGpu("NVIDIA T4 MIG 1g", "MIG-2222", gi=2, ci=0, mem_total=2**31)]
    fake(gpus)
    got, _ = nvml.cuda_gpus(env={"CUDA_VISIBLE_DEVICES": "MIG-2222"})
    assert [(g.index, g.uuid, g.mig, g.mem_total, g.nvml_index) for g in got] == \
        [(0, "MIG-2222", True, 2**31, 2)]
