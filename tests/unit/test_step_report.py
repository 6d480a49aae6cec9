"""The typed step report: the meter marks only metered steps, a StepMetrics goes to the record
and back as the same typed rows, and records written before the rows were typed still read."""

from __future__ import annotations

import json

import pytest
import torch

from gputui.core import runstore
from gputui.core.breakdown import Breakdown, make
from gputui.core.events import DeviceStep, StepMetrics, StepReport, event_from_dict
from gputui.train.strategies.meter import Meter

# a ddp rank's StepMetrics as the code before the typed report wrote it (per_device rows of
# ~15 keys, the breakdown a plain dict); one of the runs in tests/unit/run_records.py's shape
OLD_LINE = json.dumps({
    "type": "step", "t": 1.0, "epoch": 1, "step": 4, "global_step": 4, "steps_per_epoch": 8,
    "loss": 2.1, "samples_per_s": 900.0, "step_time_s": 0.28, "lr": 0.1, "comm_share": 0.2,
    "per_device": [{"device": "cpu:0", "rank": 0, "pid": 11, "samples": 128, "compute_s": 0.2,
                    "step_time_s": 0.25, "rss": 300000000, "comm_s": 0.05, "comm_calls": 1,
                    "comm_bytes": 246824, "comm_gbps": 0.0049, "samples_per_s": 640.0,
                    "breakdown": {"step_s": 0.26, "data_s": 0.01, "compute_s": 0.18,
                                  "comm_exposed_s": 0.02, "comm_overlap_s": 0.03,
                                  "optimizer_s": 0.04, "wait_s": 0.0, "host_s": 0.01}},
                   {"device": "cpu:0@node1", "rank": 1, "samples": 128, "compute_s": 0.0,
                    "step_time_s": 0.0}],
    "flops_per_s": None, "mfu": None,
    "breakdown": {"step_s": 0.26, "data_s": 0.01, "compute_s": 0.18, "comm_exposed_s": 0.02,
                  "comm_overlap_s": 0.03, "optimizer_s": 0.04, "wait_s": 0.0, "host_s": 0.01},
    "comm_gbps": 0.0049})


def test_an_old_record_line_reads_into_typed_rows():
    ev = event_from_dict(json.loads(OLD_LINE))
    assert isinstance(ev, StepMetrics)
    first, other = ev.per_device
    assert (first.device, first.rank, first.pid, first.comm_bytes) == ("cpu:0", 0, 11, 246824)
    assert first.breakdown == Breakdown(step_s=0.26, data_s=0.01, compute_s=0.18,
                                        comm_exposed_s=0.02, optimizer_s=0.04, wait_s=0.0,
                                        host_s=0.01, comm_overlap_s=0.03)
    assert other.device == "cpu:0@node1" and other.breakdown is None and other.mem_alloc is None
    assert ev.breakdown == first.breakdown


def test_a_step_goes_to_the_record_and_back_unchanged(tmp_path):
    bd = make(0.01, 0.002, 0.006, 0.001, comm_exposed_s=None, comm_overlap_s=None)
    rows = (DeviceStep("cuda:0", samples=64, compute_s=0.006, breakdown=bd, mem_alloc=2**20,
                       mem_reserved=2**21, samples_per_s=64 / 0.006), DeviceStep("cuda:1"))
    ev = StepMetrics(epoch=1, step=2, global_step=2, steps_per_epoch=4, loss=1.0,
                     samples_per_s=10.0, step_time_s=0.1, lr=0.1, per_device=rows,
                     breakdown=bd, t=5.0)
    line = json.loads(ev.to_json())
    assert line["per_device"][1] == {"device": "cuda:1", "samples": 0}  # measured fields only
    log = runstore.EventLog(tmp_path / "events.jsonl")
    log.write(ev)
    log.close()
    assert runstore.read_events(tmp_path) == [ev]


@pytest.mark.parametrize("rows", [["cpu:0"], [{"samples": 3}], 7,
                                  [{"device": "cpu:0", "breakdown": {"step_s": "x"}}]])
def test_a_damaged_row_is_refused_as_a_bad_line(rows):
    data = json.loads(OLD_LINE)
    data["per_device"] = rows
    with pytest.raises((TypeError, ValueError)):
        event_from_dict(data)


def test_the_meter_marks_metered_steps_only_and_keeps_the_last():
    m = Meter([torch.device("cpu"), torch.device("cpu")])
    m.begin(None)
    with m.compute, m.lanes[1].comm, m.optimizer:
        pass
    m.finish(samples=8)
    assert not m.measured and all(not s.marks for s in m.spans())
    m.begin(0.25)
    with m.compute:
        with m.lanes[1].compute:
            pass
    with m.optimizer:
        pass
    m.comm.add(m.clock.mark(), m.clock.mark())  # what a communication hook does
    m.finish(samples=8)
    assert m.measured and not m.on and (m.samples, m.data_s) == (8, 0.25)
    assert [len(s.marks) for s in (m.compute, m.lanes[1].compute, m.optimizer, m.comm)] == [
        1, 1, 1, 1]
    parts = m.compute.seconds() + m.optimizer.seconds()
    assert 0 < parts <= m.step_s() and m.until(m.compute_end()) <= m.step_s()
    m.begin(None)  # an unmetered step after it leaves the metered one to be read
    with m.compute:
        pass
    m.finish(samples=4)
    assert len(m.compute.marks) == 1 and m.samples == 8


def test_the_report_sums_its_rows():
    bds = [make(0.01, 0.0, 0.008, 0.001, 0.001), make(0.03, 0.0, 0.02, 0.001, 0.003)]
    report = StepReport(step_s=0.02, comm_s=0.004, devices=(
        DeviceStep("cpu:0", breakdown=bds[0], comm_gbps=1.0),
        DeviceStep("cpu:1", breakdown=bds[1])))
    assert report.comm_share() == pytest.approx(0.2)
    assert report.comm_gbps() == 1.0
    mean = report.breakdown()
    assert mean is not None and mean.step_s == pytest.approx(0.02)
    assert mean.comm_exposed_s == pytest.approx(0.002)
