"""A run's energy from the GPUs' energy counter (through the fake NVML at the boundary), its
time and energy to a target, and the allocator peak against the memory model, as recorded and
as compare shows them."""

from __future__ import annotations

import json

import pytest

from fakes.nvml import FakeGpu, FakeNvml
from gputui.core import runstore
from gputui.core.devices import Device
from gputui.core.events import EpochEnd, InitDone, MemoryReport, MemoryRow
from gputui.core.memcheck import memory_check
from gputui.hw import nvml
from gputui.runs import energy
from gputui.runs.compare.table import compare, summary_lines
from run_records import write_record


@pytest.fixture
def gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = [FakeGpu("NVIDIA H100", "GPU-aaaa", "00000000:1A:00.0", energy_mj=1_000_000),
             FakeGpu("NVIDIA H100", "GPU-bbbb", "00000000:3B:00.0", energy_mj=2_000_000)]
    nvml.use_module(FakeNvml(found))
    yield found
    nvml.use_module(None)


def epoch(n: int, acc: float) -> EpochEnd:
    return EpochEnd(epoch=n, epochs=2, seconds=10.0, train_loss=1.0, test_acc=acc,
                    samples_per_s=100.0)


def test_the_meter_takes_each_epoch_from_the_counters_and_records_it(gpus, tmp_path):
    meter = energy.EnergyMeter([Device("cuda", 0), Device("cuda", 1)])
    gpus[0].energy_mj += 500_000  # set-up: not counted
    meter.seen(InitDone(seconds=1.0))
    gpus[0].energy_mj += 3_000_000
    gpus[1].energy_mj += 1_000_000
    meter.seen(epoch(1, 0.5))
    gpus[0].energy_mj += 2_000_000
    meter.seen(epoch(2, 0.9))
    meter.write(tmp_path)
    got = energy.read(tmp_path)
    assert [e["joules"] for e in got] == [4000.0, 2000.0]
    assert got[0]["per_device"] == {"cuda:0": 3000.0, "cuda:1": 1000.0}
    summary = runstore.RunSummary.from_dict(
        {"train_samples": 1000, "steps_per_epoch": 10,
         "per_epoch": [{"epoch": 1, "seconds": 10.0, "test_acc": 0.5},
                       {"epoch": 2, "seconds": 12.0, "test_acc": 0.9}]})
    assert energy.figures(summary, got) == {"energy_j": 6000.0, "j_per_sample": 3.0,
                                            "j_per_step": 300.0}
    assert energy.to_target(summary, got, acc=0.9) == {"epoch": 2, "seconds": 22.0,
                                                       "joules": 6000.0}
    assert energy.to_target(summary, got, acc=0.95) is None


def test_a_gpu_without_the_counter_or_a_cpu_run_records_nothing(gpus, tmp_path):
    gpus[0].energy_mj = None
    meter = energy.EnergyMeter([Device("cuda", 0), Device("cpu", 0)])
    meter.seen(InitDone(seconds=1.0))
    meter.seen(epoch(1, 0.5))
    meter.write(tmp_path)
    assert not (tmp_path / energy.FILE).exists() and energy.read(tmp_path) == []


def test_the_memory_check_sets_the_allocator_peak_against_the_model_terms():
    rows = (MemoryRow(device="cuda:0", params=100, grads=100, optim=200, activations=50,
                      alloc=300, peak=600), MemoryRow(device="cpu:1", params=1, grads=1, optim=0))
    later = (MemoryRow(device="cuda:0", params=100, grads=100, optim=200, activations=50,
                       peak=520),)
    events = [MemoryReport(epoch=1, per_device=rows), MemoryReport(epoch=2, per_device=later)]
    assert memory_check(events) == [{"device": "cuda:0", "peak": 600, "predicted": 450,
                                     "diff": 150}]
    assert runstore.summarize(events).memory_check[0].diff == 150


def test_compare_shows_energy_per_sample_and_time_and_energy_to_the_baseline(tmp_path):
    base = write_record(tmp_path, "20260101-000000-base", acc=0.9)
    run = write_record(tmp_path, "20260101-000100-two", strategy="ddp", n=2, acc=0.92)
    (run / energy.FILE).write_text(json.dumps({"per_epoch": [
        {"epoch": 1, "joules": 1500.0}, {"epoch": 2, "joules": 500.0}]}))
    items = compare([run], tmp_path)
    (it,) = items
    assert it.baseline == base.name and it.energy_j == 2000.0
    assert it.j_per_sample == pytest.approx(1.0)  # 2000 J over 2 epochs of 1000 samples
    assert it.to_target == {"epoch": 1, "seconds": 1.0, "joules": 1500.0}
    lines = summary_lines(items)
    assert f"{run.name}: energy 2.00 kJ over its epochs, 1 J/sample (the GPUs' energy " \
           f"counter)" in lines
    assert (f"{run.name}: reached test acc >= 90.0% (baseline {base.name}'s final) at epoch "
            f"1: 1.0 s of training, 1.50 kJ") in lines
    (given,) = compare([run], tmp_path, target_acc=0.95)
    assert given.to_target is None and given.target == "test acc >= 95.0% (given)"
