"""Device choices as users write them, and every refusal with its exact one-line message."""

import pytest

from gputui.core.devices import (DeviceSpecError, GpuInfo, GpuProcess, cpu_devices, parse_spec,
                            requested_count, wants_gpus)
from gputui.hw.discovery import busy_warnings, resolve_devices

GPUS = [GpuInfo(0, "NVIDIA A100"), GpuInfo(1, "NVIDIA A100"), GpuInfo(2, "NVIDIA T4")]
HELP = "'cpu', 'cpu*N', GPU indices '0,2', 'all', a count 'N', 'cuda:*' or 'cuda:1'"
NO_DRIVER = "no NVIDIA driver is installed: libnvidia-ml.so.1 was not found"


@pytest.mark.parametrize("spec, names", [
    ("cpu", ["cpu:0"]),
    ("cpu*4", ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]),
    ("CPU * 2", ["cpu:0", "cpu:1"]),
    ("cpu*64", [f"cpu:{i}" for i in range(64)]),
    ("all", ["cuda:0", "cuda:1", "cuda:2"]),
    ("ALL", ["cuda:0", "cuda:1", "cuda:2"]),
    ("cuda:*", ["cuda:0", "cuda:1", "cuda:2"]),
    ("GPU:*", ["cuda:0", "cuda:1", "cuda:2"]),
    ("2", ["cuda:0", "cuda:1"]),
    ("3", ["cuda:0", "cuda:1", "cuda:2"]),
    ("1", ["cuda:0"]),
    ("0", ["cuda:0"]),
    ("0,2", ["cuda:0", "cuda:2"]),
    ("2,0", ["cuda:2", "cuda:0"]),
    (" 0 , 2 ", ["cuda:0", "cuda:2"]),
    ("1,", ["cuda:1"]),
    ("cuda:1", ["cuda:1"]),
    ("GPU:2", ["cuda:2"]),
    ("cuda:0,cuda:2", ["cuda:0", "cuda:2"]),
])
def test_good_specs(spec, names):
    assert [d.name for d in parse_spec(spec, GPUS)] == names


def test_devices_carry_labels_and_torch_strings():
    cpu = parse_spec("cpu*2", GPUS)
    assert [d.torch_device for d in cpu] == ["cpu", "cpu"]
    assert cpu[0].label == "CPU virtual device"
    gpu = parse_spec("2,0", GPUS)
    assert [(d.torch_device, d.label) for d in gpu] == [("cuda:2", "NVIDIA T4"),
                                                        ("cuda:0", "NVIDIA A100")]


@pytest.mark.parametrize("spec, message", [
    ("", f"the device choice is empty; use {HELP}"),
    ("   ", f"the device choice is empty; use {HELP}"),
    ("cpu*0", "'cpu*0': the number of CPU virtual devices must be 1 to 64"),
    ("cpu*65", "'cpu*65': the number of CPU virtual devices must be 1 to 64"),
    ("cpu*x", f"'cpu*x': cannot read 'cpu*x'; use {HELP}"),
    ("4", "'4' asks for 4 GPUs but this machine has only 3; use a count up to 3, or 'all'"),
    ("0,7", "'0,7': GPU 7 does not exist; this machine has 3 GPU(s), indices 0-2"),
    ("cuda:9", "'cuda:9': GPU 9 does not exist; this machine has 3 GPU(s), indices 0-2"),
    ("0,0", "'0,0' names a GPU twice; list each index once"),
    ("cuda:1,1", "'cuda:1,1' names a GPU twice; list each index once"),
    ("cpu,0", "'cpu,0' mixes CPU virtual devices and GPUs; choose either cpu*N or GPU indices"),
    ("abc", f"'abc': cannot read 'abc'; use {HELP}"),
    ("-1", f"'-1': cannot read '-1'; use {HELP}"),
    ("0;1", f"'0;1': cannot read '0;1'; use {HELP}"),
    ("cuda:", f"'cuda:': cannot read 'cuda:'; use {HELP}"),
    (",", f"',' names no device; use {HELP}"),
    ("0,,1", f"'0,,1': cannot read ''; use {HELP}"),
])
def test_bad_specs_exact_messages(spec, message):
    with pytest.raises(DeviceSpecError) as err:
        parse_spec(spec, GPUS)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec, message", [
    ("all", f"'all' selects GPUs but none is available ({NO_DRIVER}); use cpu or cpu*N"),
    ("cuda:*", f"'cuda:*' selects GPUs but none is available ({NO_DRIVER}); use cpu or cpu*N"),
    ("2", f"'2' asks for 2 GPUs but this machine has none ({NO_DRIVER}); use cpu*2"),
    ("0", f"'0': GPU 0 does not exist, no GPU is available ({NO_DRIVER}); use cpu or cpu*N"),
    ("0,1", f"'0,1': GPU 0 does not exist, no GPU is available ({NO_DRIVER}); "
            f"use cpu or cpu*N"),
])
def test_gpu_specs_without_gpus_say_why(spec, message):
    with pytest.raises(DeviceSpecError) as err:
        parse_spec(spec, [], NO_DRIVER)
    assert str(err.value) == message


def test_cpu_specs_need_no_gpu():
    assert [d.name for d in parse_spec("cpu*3", [], NO_DRIVER)] == ["cpu:0", "cpu:1", "cpu:2"]


@pytest.mark.parametrize("spec, wants, count", [
    ("cpu", False, 1), ("cpu*4", False, 4), ("all", True, 1), ("cuda:*", True, 1),
    ("2", True, 2), ("0", True, 1), ("0,2", True, 2), ("1,", True, 1),
])
def test_wants_gpus_and_requested_count(spec, wants, count):
    assert wants_gpus(spec) is wants
    assert requested_count(spec) == count


def test_resolve_falls_back_to_cpu_only_when_asked():
    assert [d.name for d in resolve_devices("2", fallback="cpu", gpus=[], reason=NO_DRIVER)] \
        == ["cpu:0", "cpu:1"]
    with pytest.raises(DeviceSpecError, match=r"^'2' asks for 2 GPUs but this machine has none"):
        resolve_devices("2", fallback="none", gpus=[], reason=NO_DRIVER)
    # With GPUs present but not the ones asked for, the fallback applies too (issue 10: a
    # 2-GPU preset on a 1-GPU machine), and only when the preset asks for it.
    assert [d.name for d in resolve_devices("0,5", fallback="cpu", gpus=GPUS)] == \
        ["cpu:0", "cpu:1"]
    with pytest.raises(DeviceSpecError, match=r"^'0,5': GPU 5 does not exist"):
        resolve_devices("0,5", fallback="none", gpus=GPUS)
    assert [d.name for d in resolve_devices("cpu*2")] == ["cpu:0", "cpu:1"]


def test_busy_warnings_name_other_processes_not_ours():
    gpus = [GpuInfo(0, "NVIDIA A100"),
            GpuInfo(1, "NVIDIA A100", busy=True,
                    processes=(GpuProcess(4242, 3 * 1024**3, "python"), GpuProcess(77))),
            GpuInfo(2, "NVIDIA T4", busy=True, processes=(GpuProcess(900, None, "train"),))]
    chosen = parse_spec("0,1,2", gpus)
    lines = busy_warnings(chosen, gpus, own_pids={900})
    assert lines == ["cuda:1 (NVIDIA A100) is busy, used by 2 other process(es): "
                     "pid 4242 python 3.0 GiB, pid 77; training will share its memory and "
                     "compute"]
    assert busy_warnings(parse_spec("0", gpus), gpus) == []


def test_busy_warnings_cpu_devices_outnumbering_cores():
    assert busy_warnings(cpu_devices(4), [], cpu_cores=2) == [
        "4 CPU virtual devices share 2 CPU core(s), so they take turns; per-device speed "
        "will be lower than on separate devices"]
    assert busy_warnings(cpu_devices(2), [], cpu_cores=2) == []
