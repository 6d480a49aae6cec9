"""pp's figures without processes: the prediction's bubble term and stage memory, the meter's
split of a stage's idle time into transfers and bubble (its marks given), the line the printer
and the app show, and compare's bubble column read from a record."""

from __future__ import annotations

import json

import pytest

from gputui.core import breakdown
from gputui.runs.predict.scaling import Inputs, predict, static_bytes


def test_pp_prediction_is_compute_stretched_by_the_bubble():
    inp = Inputs(n=2, on_gpu=False, batch=256, batch_1=256, t_1=0.032, t_c=0.020,
                 t_sync=0.002, log_every=10, params=1000, chunks=4)
    p = predict("pp", inp)
    # (m + N - 1) / m = 5 / 4: each stage idles 1/5 of the step, the bubble
    assert p.step_time_s == pytest.approx(0.020 * 5 / 4 + 0.0002)
    assert p.formula == "t_c (m + N - 1) / m + t_sync / log_every"
    assert p.mem_per_device == -(-static_bytes(inp) // 2)  # each stage holds half the layers
    assert predict("pp", Inputs(n=2, on_gpu=False, batch=256, batch_1=256, t_1=0.03)
                   ).reason == "not measured: t_c, t_sync"


def test_1f1b_keeps_at_most_n_micro_batches_of_activations():
    inp = Inputs(n=2, on_gpu=True, batch=256, batch_1=256, t_1=0.03, t_c=0.02, t_sync=0.001,
                 params=1000, chunks=8, activations_1=8000, schedule="gpipe")
    gpipe = predict("pp", inp).mem_per_device
    ofb = predict("pp", Inputs(**{**inp.__dict__, "schedule": "1f1b"})).mem_per_device
    static = -(-static_bytes(inp) // 2)
    assert gpipe - static == 8000 // 2  # all 8 micro-batches of its half of the layers
    assert ofb - static == 8000 // 2 * 2 // 8  # 2 in flight of 8


class _Op:
    def __init__(self, peer: int, nbytes: int):
        import torch

        self.peer, self.tensor = peer, torch.zeros(nbytes // 4)


def _meters(stage: int, chunks: int):
    """A Meter on the CPU and the PipeMeter beside it, metering (marks set by hand below)."""
    pytest.importorskip("torch.distributed.pipelining")
    import torch

    from gputui.train.strategies.meter import Meter
    from gputui.train.strategies.pp_meter import PipeMeter

    meter = Meter([torch.device("cpu")])
    pipe = PipeMeter(meter, stage=stage, stages=2, chunks=chunks)
    meter.begin(0.0)
    pipe.start_step(True)
    return meter, pipe


def test_the_meter_splits_idle_into_transfers_and_bubble():
    meter, pipe = _meters(stage=1, chunks=4)
    assert pipe.theory == pytest.approx(1 / 5)
    meter.start, pipe.begin = 0.0, 0.0
    meter.compute.marks = [(1.0, 2.0), (3.0, 4.0)]  # 2 s of compute in a 10 s pipeline
    pipe.note([_Op(0, 400)], sent=False)
    pipe.note([_Op(0, 400)], sent=True)
    pipe.end = 10.0
    meter.optimizer.marks = [(10.5, 11.0)]  # 10.0-10.5: host (zero_grad and the like)
    meter.end, meter.measured = 11.0, True
    pipe.one_way = {0: 0.25}  # the calibration's half round trip to stage 0
    f = pipe.figures()
    assert f["recv_s"] == f["send_s"] == 0.25
    assert f["bubble_s"] == pytest.approx(10 - 2 - 0.5)
    assert f["bubble_share"] == pytest.approx(7.5 / 10)
    bd = f["breakdown"]
    assert bd.wait_s == pytest.approx(7.5) and bd.compute_s == 2.0
    assert bd.comm_exposed_s == pytest.approx(0.5)  # sends and receives
    assert bd.optimizer_s == 0.5 and bd.host_s == pytest.approx(0.5)
    assert bd.step_s == pytest.approx(11.0)
    assert f["p2p_bytes"] == 800 and f["p2p_messages"] == 2


def test_a_tied_gradient_sum_is_a_message_each_way_to_the_other_end():
    import torch

    meter, pipe = _meters(stage=0, chunks=2)
    pipe.note_tie(torch.zeros(10), first=True)
    assert pipe.messages == [(True, 1, 40), (False, 1, 40)]


def test_transfers_never_exceed_the_idle_time():
    meter, pipe = _meters(stage=0, chunks=2)
    meter.start, pipe.begin, pipe.end, meter.end = 0.0, 0.0, 1.0, 1.0
    meter.compute.marks = [(0.0, 0.9)]
    pipe.note([_Op(1, 40)] * 4, sent=True)
    pipe.one_way = {1: 1.0}  # a slow calibration: 4 s of sends in 0.1 s idle
    f = pipe.figures()
    assert f["send_s"] == pytest.approx(0.1) and f["bubble_s"] == pytest.approx(0.0)


def test_metering_off_records_nothing():
    meter, pipe = _meters(stage=0, chunks=2)
    meter.finish()
    meter.begin(None)  # a step the loop does not meter
    pipe.start_step(False)
    with meter.compute:
        pass
    pipe.note([_Op(1, 40)], sent=True)
    assert meter.compute.marks == [] and pipe.messages == []


ROW = {"device": "cpu:1", "stage": 1, "bubble_share": 0.41, "bubble_theory": 0.2,
       "send_s": 0.0012, "recv_s": 0.0011}


def _row(**changes):
    from gputui.core.events import DeviceStep

    return DeviceStep.from_dict(dict(ROW, **changes))


def test_the_pipeline_line():
    assert breakdown.pipeline_line(_row()) == ("stage 1: bubble 41% of the pipeline (theory 20%) "
                                            "· sends 1.2 ms · receives 1.1 ms")
    assert breakdown.pipeline_line(_row(bubble_share=None)) is None


def test_compare_reads_the_bubble_from_a_record(tmp_path):
    from gputui.core.events import StepMetrics, event_from_dict
    from gputui.runs.compare.cells import fmt
    from gputui.runs.compare.table import read_hw_figures

    def step(share: float) -> dict:
        ev = StepMetrics(epoch=1, step=1, global_step=1, steps_per_epoch=1, loss=1.0,
                         samples_per_s=1.0, step_time_s=1.0, lr=0.1,
                         per_device=(_row(bubble_share=share),
                                     _row(stage=0, bubble_share=share)))
        return ev.to_dict()

    events = [step(0.9), step(0.5), step(0.3)]  # the first (warm-up) left out
    figures = read_hw_figures(tmp_path, [event_from_dict(json.loads(json.dumps(e)))
                                         for e in events])
    assert figures["bubble_share"] == pytest.approx(0.4)
    assert figures["bubble_theory"] == pytest.approx(0.2)
    assert fmt("bubble_share", 0.4) == "40%"
