"""`gputui devices`: the table, --json and --spec, with and without (fake) GPUs."""

import argparse
import json
import os

import psutil
import pytest

from gputui.cli import devices as cli_devices
from gputui.hw import nvml
from fakes.nvml import FakeGpu, FakeNvml

NO_DRIVER_SENTENCE = ("No GPU is listed because the NVIDIA kernel driver is not loaded; CPU "
                      "virtual devices (cpu, cpu*N) are used instead.")


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gputui")
    cli_devices.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["devices", *argv])
    return args.func(args)


@pytest.fixture
def no_driver():
    nvml.use_module(FakeNvml([], init_error=FakeNvml.NVMLError_DriverNotLoaded))
    yield
    nvml.use_module(None)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu("NVIDIA A100", "GPU-aaaa", "00000000:1A:00.0", util=3),
            FakeGpu("NVIDIA T4", "GPU-bbbb", "00000000:3B:00.0", util=88, temp=None,
                    mem_used=3 * 1024**3, processes=[(os.getpid(), 3 * 1024**3)])]
    nvml.use_module(FakeNvml(gpus))
    yield gpus
    nvml.use_module(None)


def test_json_without_gpu(no_driver, capsys):
    assert run("--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == []
    assert data["no_gpu_reason"] == NO_DRIVER_SENTENCE
    assert data["cpu"]["cores_logical"] == psutil.cpu_count()
    assert 0 < data["cpu"]["mem_used"] < data["cpu"]["mem_total"]
    assert data["driver"] is None


def test_table_without_gpu(no_driver, capsys):
    assert run() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"CPU: {psutil.cpu_count()} cores")
    assert NO_DRIVER_SENTENCE in out


def test_json_with_gpus(two_gpus, capsys):
    assert run("--json", "--spec", "1") == 0
    data = json.loads(capsys.readouterr().out)
    assert [(g["device"], g["name"], g["busy"], g["util"]) for g in data["gpus"]] == \
        [("cuda:0", "NVIDIA A100", False, 3.0), ("cuda:1", "NVIDIA T4", True, 88.0)]
    assert data["gpus"][1]["processes"][0]["pid"] == os.getpid()
    assert data["no_gpu_reason"] is None and data["driver"] == "575.57.08"
    assert data["spec"]["devices"] == [{"name": "cuda:0", "kind": "cuda", "index": 0,
                                        "label": "NVIDIA A100"}]


def test_table_with_gpus_and_busy_warning(two_gpus, capsys):
    assert run("--spec", "0,1") == 0
    out = capsys.readouterr().out
    t4_row = next(line for line in out.splitlines() if "cuda:1" in line and "T4" in line)
    for cell in ("3.0/16.0 GiB", "88%", "n/a", "50/250 W", "busy", f"pid {os.getpid()}"):
        assert cell in t4_row
    assert "'0,1' resolves to 2 device(s): cuda:0, cuda:1" in out
    assert "warning: cuda:1 (NVIDIA T4) is busy, used by 1 other process(es)" in out


def test_bad_spec_is_one_line_and_exit_2(two_gpus, capsys):
    assert run("--spec", "0,7") == 2
    err = capsys.readouterr().err
    assert err == ("gputui: error: --spec: '0,7': GPU 7 does not exist; this machine has 2 "
                   "GPU(s), indices 0-1\n")
    assert run("--json", "--spec", "cpu*99") == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "must be 1 to 64" in err  # scripts reading stderr see it
    data = json.loads(out)
    assert data["spec"] == {"input": "cpu*99", "error": "'cpu*99': the number of CPU virtual "
                                                         "devices must be 1 to 64"}


def test_cpu_spec_warns_when_devices_outnumber_cores(no_driver, capsys):
    n = psutil.cpu_count() + 1
    assert run("--spec", f"cpu*{n}") == 0
    out = capsys.readouterr().out
    assert f"'cpu*{n}' resolves to {n} device(s): cpu:0," in out
    assert f"warning: {n} CPU virtual devices share {n - 1} CPU core(s)" in out
