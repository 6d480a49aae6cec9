"""Where a step's time goes (gputui.core.breakdown): the parts add up to the step for every
single-process strategy, and a delay injected through the [debug] knobs shows up in the part
it claims (ddp's are in test_equivalence_ddp.py, which shares one 2-rank launch)."""

from __future__ import annotations

from statistics import median

import pytest
import torch

from gputui.core import breakdown
from gputui.train import strategies
from gputui.hw.discovery import resolve_devices
from gputui.train.data import TensorBatches
from gputui.train.loop import train
from gputui.train.strategies.data_parallel import DeviceMarks
from gputui.train.strategies.meter import Meter
from strategy_harness import make_config, small_data

DELAY = 0.05


def test_parts_add_up_and_the_remainder_is_host():
    bd = breakdown.make(span_s=0.010, data_s=0.002, compute_s=0.006, optimizer_s=0.001,
                        comm_exposed_s=0.002, comm_overlap_s=0.003)
    assert bd.step_s == pytest.approx(0.012) and bd.host_s == pytest.approx(0.001)
    assert breakdown.total(bd) == pytest.approx(bd.step_s)
    # device-clock parts longer than the host's span: no negative host, the step is their sum
    over = breakdown.make(span_s=0.001, data_s=0.0, compute_s=0.004, optimizer_s=0.001)
    assert over.host_s == 0.0 and over.step_s == pytest.approx(0.005)
    shares = breakdown.shares(bd)
    assert shares["comm_exposed_share"] == pytest.approx(2 / 12)
    assert shares["comm_overlap_share"] == pytest.approx(3 / 12)
    assert breakdown.line(bd).startswith("step 12.0 ms: compute 50% · comm 17% (+25% hidden)")
    assert sum(len(text) for text, _ in breakdown.bar(bd, 17)) == 17


def test_mean_keeps_unmeasured_parts_unmeasured():
    a = breakdown.make(0.01, 0.0, 0.008, 0.001, comm_exposed_s=None, comm_overlap_s=None)
    b = breakdown.make(0.03, 0.0, 0.020, 0.001, comm_exposed_s=None, comm_overlap_s=None)
    m = breakdown.mean([a, None, b])
    assert m is not None and m.step_s == pytest.approx(0.02) and m.comm_exposed_s is None
    assert breakdown.mean([None]) is None
    assert breakdown.shares(m)["comm_exposed_share"] is None


def _run(strategy: str, spec: str, **debug) -> list:
    """One epoch (10 steps) through the real loop, every step metered; the StepMetrics."""
    cfg = make_config(strategy, spec, "lenet", 32, **{"run.log_every": 1, "run.epochs": 1},
                      **debug)
    ds = small_data()
    s = strategies.load(strategy)(cfg, resolve_devices(spec), ds.in_channels,
                                      ds.image_size, ds.num_classes)
    s.setup()
    events = []
    train(cfg, s, TensorBatches(ds.train_x, ds.train_y, s.batch_size, cfg.run.seed),
          ds, events.append, lambda: False)
    return [e for e in events if e.kind == "step"]


def _median(steps: list, part: str, device: int = 0) -> float:
    return median(e.per_device[device].breakdown.part(part) for e in steps[1:])  # warm-up out


@pytest.mark.parametrize("strategy,spec", [("single", "cpu"), ("dp", "cpu*2"),
                                           ("scratch", "cpu*2"), ("model_parallel", "cpu*2")])
def test_every_device_breakdown_adds_up_to_its_step(strategy, spec):
    steps = _run(strategy, spec)
    assert len(steps) == 10
    for e in steps:
        rows = [r.breakdown for r in e.per_device if r.breakdown is not None]
        assert rows and e.breakdown is not None
        for bd in rows:
            assert bd.compute_s > 0 and bd.step_s > 0
            assert breakdown.total(bd) == pytest.approx(bd.step_s, rel=1e-9, abs=1e-12)
        if len(rows) == 2:  # devices one process drives in turn wait for each other
            assert all(bd.wait_s > 0 for bd in rows)


def test_a_delay_in_scratch_allreduce_shows_as_exposed_comm():
    plain, slow = _run("scratch", "cpu*2"), _run("scratch", "cpu*2", **{"debug.comm_delay_s": DELAY})
    for device in (0, 1):
        grown = _median(slow, "comm_exposed_s", device) - _median(plain, "comm_exposed_s", device)
        assert grown >= 0.7 * DELAY, grown


def test_a_delay_in_the_data_path_shows_as_data():
    plain, slow = _run("single", "cpu"), _run("single", "cpu", **{"debug.data_delay_s": DELAY})
    grown = _median(slow, "data_s") - _median(plain, "data_s")
    assert grown >= 0.7 * DELAY, grown


class ScriptedClock:
    """A clock whose marks are given times (seconds): the arithmetic of a CUDA step without a
    GPU, where each mark would be an event read at the log interval."""

    cuda = False

    def mark(self):
        raise AssertionError("the test hands the marks in")

    def seconds(self, start, end):
        return end - start


def scripted_meter(clock) -> Meter:
    """A meter on ``clock`` whose metered step the test writes mark by mark."""
    m = Meter([torch.device("cpu")], clock=clock)
    m.measured = True
    return m


def test_ddp_split_compute_ends_at_the_last_bucket_launch():
    from gputui.train.strategies.comm_timer import CommTimer

    m = scripted_meter(ScriptedClock())
    timer = CommTimer(m)
    # three buckets: two overlap backward's compute, the last is launched when it ends (6)
    m.start, m.end = 0.0, 12.0
    m.compute.marks = [(0.5, 10.0)]  # backward's wait for the all-reduces ends at 10
    for span in [(1.0, 3.0), (2.0, 5.0), (6.0, 8.0)]:
        m.comm.add(*span)
    compute_end, exposed, hidden = timer.split()
    assert (compute_end, exposed, hidden) == (6.0, 4.0, 4.0)
    assert m.comm.busy(m.start) == 6.0  # busy: 1-5 and 6-8
    m.comm.marks = []
    assert timer.split() is None  # a no_sync step synced nothing


class ScriptedMarks(ScriptedClock, DeviceMarks):
    """DeviceMarks with given times: each mark is one time per device."""

    def __init__(self):
        pass

    def seconds_on(self, i, start, end):
        return end[i] - start[i]


def test_dp_on_gpus_gives_every_device_its_own_breakdown():
    from gputui.train.strategies.data_parallel import other_devices

    # marks (start, begin, backward_end, end) as each of three GPUs' streams reached them:
    # device 1 finished its replica's backward at 7 ms, device 2 at 9, the update ran to 10
    m = scripted_meter(ScriptedMarks())
    m.start, m.end, m.data_s = (0.0, 0.0, 0.0), (0.010, 0.010, 0.010), 0.002
    m.compute.marks = [((0.001, 0.001, 0.001), (0.008, 0.007, 0.009))]
    rows = other_devices(m, 3)
    assert len(rows) == 2
    for bd, compute, wait in zip(rows, (0.006, 0.008), (0.003, 0.001)):
        assert bd.compute_s == pytest.approx(compute) and bd.wait_s == pytest.approx(wait)
        assert bd.optimizer_s == 0.0 and bd.comm_exposed_s is None
        assert bd.step_s == pytest.approx(0.012)  # data and the span on its own clock
        assert breakdown.total(bd) == pytest.approx(bd.step_s)
