"""The prediction formula with known inputs, the steady-state rule, the trust rules, and one
lean end-to-end `gputui predict` (dp on CPU needs only the one-device measurement)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from gputui.core.events import StepMetrics
from gputui.core.steady import WARMUP_STEPS, spread, steady_figures
from gputui.core.trust import flags, refuse_baseline
from gputui.runs.predict.scaling import BUCKET_BYTES, Inputs, predict, short_of, static_bytes
from gputui.train.comm_ranks import fsdp_calls, padded_bytes


def test_ddp_on_cpu_is_compute_plus_allreduce_plus_the_window_sync():
    inp = Inputs(n=2, on_gpu=False, batch=256, batch_1=256, t_1=0.032, t_c=0.030,
                 t_ar=0.0025, t_sync=0.002, log_every=10, params=1000)
    p = predict("ddp", inp)
    assert p.step_time_s == pytest.approx(0.030 + 0.0025 + 0.0002)
    assert p.speedup == pytest.approx(0.032 / 0.0327)
    assert p.efficiency == pytest.approx(p.speedup / 2)
    assert p.mem_per_device == static_bytes(inp) == 1000 * 4 * 3  # params, grads, momentum
    assert static_bytes(replace(inp, optim_states=2)) == 1000 * 4 * 4  # Adam's two moments


def test_ddp_takes_its_own_one_rank_step_where_measured_and_says_which():
    inp = Inputs(n=2, on_gpu=False, batch=256, batch_1=256, t_1=0.032, t_c=0.030,
                 t_own={"ddp": 0.031}, t_ar=0.0025, t_sync=0.002, log_every=10)
    ddp = predict("ddp", inp)
    assert ddp.step_time_s == pytest.approx(0.031 + 0.0025 + 0.0002)
    assert ddp.formula.startswith("t_own") and ddp.terms["t_own"] == 0.031
    fsdp = predict("fsdp", inp)  # not measured with fsdp itself: single's t_c, said so
    assert fsdp.step_time_s == pytest.approx(0.030 + 1.5 * 0.0025 + 0.0002)
    assert fsdp.formula.startswith("t_c") and "t_own" not in fsdp.terms


def test_fsdp_takes_its_measured_collectives_in_place_of_the_allreduce_estimate():
    inp = Inputs(n=2, on_gpu=False, batch=256, batch_1=256, t_1=0.004,
                 t_own={"fsdp": 0.0045}, t_ar=0.003, t_fsdp=0.0135, t_sync=0.002,
                 log_every=10)
    p = predict("fsdp", inp)
    assert p.step_time_s == pytest.approx(0.0045 + 0.0135 + 0.0002)
    assert p.speedup == pytest.approx((256 / 0.0182) / (256 / 0.004))
    assert "t_fsdp" in p.formula and p.terms["t_fsdp"] == 0.0135 and "t_ar" not in p.terms
    kept = predict("fsdp", replace(inp, t_fsdp=None))  # figures kept before t_fsdp was
    assert kept.step_time_s == pytest.approx(0.0045 + 1.5 * 0.003 + 0.0002)
    assert "1.5 t_ar" in kept.formula and "t_fsdp" not in kept.formula
    assert predict("ddp", replace(inp, t_own={"ddp": 0.0045})).step_time_s == pytest.approx(
        0.0045 + 0.003 + 0.0002)  # ddp never reads t_fsdp


def test_tp_is_compute_plus_four_activation_all_reduces_per_block():
    inp = Inputs(n=2, on_gpu=False, batch=32, batch_1=32, t_1=0.1, t_c=0.05, t_act=0.001,
                 t_sync=0.002, log_every=10, tp_blocks=4, params=1000)
    p = predict("tp", inp)
    assert p.step_time_s == pytest.approx(0.05 + 4 * 4 * 0.001 + 0.0002)
    assert p.terms["L"] == 4 and p.formula.startswith("t_c + 4 L t_act")
    assert p.mem_per_device == -(-static_bytes(inp) // 2)  # the blocks' share (a lower bound)
    assert "built-in GPT" in predict("tp", replace(inp, tp_blocks=0)).reason
    assert "t_act" in predict("tp", replace(inp, t_act=None)).reason  # not measured: said so


def test_fsdp_calls_follow_fully_shard_and_units_are_padded_per_parameter():
    # three units, no root parameters: the MLP's 9 collectives per step (its fsdp record's
    # comm_calls); a root with parameters adds its forward all-gather and last reduce-scatter
    ag, rs = "all_gather", "reduce_scatter"
    assert fsdp_calls([30, 20, 10]) == [(ag, 30), (ag, 20), (ag, 10), (ag, 10), (rs, 10),
                                        (ag, 20), (rs, 20), (ag, 30), (rs, 30)]
    with_root = fsdp_calls([30, 0, 10], root=8)  # a unit without parameters: no collective
    assert with_root[0] == (ag, 8) and with_root[-1] == (rs, 8) and len(with_root) == 8
    # a 5x3 weight and 5 biases over 2 ranks: each padded to 6 rows
    assert padded_bytes([(5, 3), (5,)], 2) == (6 * 3 + 6) * 4
    assert padded_bytes([(4, 3)], 2) == 48 and padded_bytes([()], 3) == 12


def test_gpu_overlap_hides_all_but_the_last_bucket_and_fsdp_shards_memory():
    g = 4 * BUCKET_BYTES
    inp = Inputs(n=2, on_gpu=True, batch=512, batch_1=256, t_1=0.01, t_c=0.01, t_ar=0.004,
                 t_sync=0.0, grad_bytes=g, params=g // 4, momentum=False,
                 activations_1=1000)
    ddp = predict("ddp", inp)
    assert ddp.step_time_s == pytest.approx(0.01 + 0.004 * 0.25)  # 3 of 4 buckets hidden
    assert ddp.speedup == pytest.approx((512 / 0.011) / (256 / 0.01))
    fsdp = predict("fsdp", inp)
    assert fsdp.step_time_s == pytest.approx(0.01 + 0.006 * 0.25)
    assert fsdp.mem_per_device == g * 2 // 2 + 1000  # (params + grads) / 2 + activations


def test_scratch_and_dp_on_cpu_run_in_one_process_and_missing_inputs_say_so():
    inp = Inputs(n=2, on_gpu=False, batch=256, batch_1=256, t_1=0.03, t_seq=0.02,
                 t_copy=0.001)
    assert predict("scratch", inp).step_time_s == pytest.approx(2 * 0.02 + 0.001)
    assert predict("dp", inp).speedup == pytest.approx(1.0)
    missing = predict("ddp", inp)
    assert missing.step_time_s is None and "t_c" in missing.reason and "t_ar" in missing.reason
    assert short_of(0.7, 1.0) and not short_of(0.9, 1.0) and not short_of(0.8, 1.0, noise=0.1)


def _windows(times: list[float], batch: int = 100, every: int = 5) -> list[StepMetrics]:
    return [StepMetrics(epoch=1, step=(i + 1) * every, global_step=(i + 1) * every,
                        steps_per_epoch=every * len(times), loss=1.0,
                        samples_per_s=batch / t, step_time_s=t, lr=0.1)
            for i, t in enumerate(times)]


def test_steady_state_leaves_out_the_warm_up_windows():
    # windows of 5 steps: the first two start within the first 10 steps (warm-up)
    s = steady_figures(_windows([1.0, 0.5, 0.1, 0.1, 0.1]))
    assert WARMUP_STEPS == 10 and s["warmup_steps"] == 10 and s["steps"] == 15
    assert s["samples_per_s"] == pytest.approx(1000.0) and s["step_time_s"] == pytest.approx(0.1)
    assert s["noise"] == pytest.approx(0.0)
    assert steady_figures(_windows([1.0, 0.5])) is None  # all warm-up: no steady state
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}


def _row(**kw):
    base = dict(id="run", devices=2, device_names=["cpu:0", "cpu:1"], strategy="ddp",
                steady=True, noise=0.01, threads=1, cores=2, resumed=False)
    return SimpleNamespace(**{**base, **kw})


def test_impossible_speedups_are_flagged_with_the_reason():
    base = _row(id="base", devices=1, device_names=["cpu:0"], strategy="single")
    assert flags(_row(), base, 0.9) == []
    assert flags(_row(), base, 1.06) == []  # two 1-thread ranks may beat one 2-thread process
    one = flags(_row(devices=1, device_names=["cpu:0"], strategy="scratch"), base, 6.55)
    assert len(one) == 1 and "efficiency 655%" in one[0]
    shared = flags(_row(strategy="model_parallel"), base, 1.61)
    assert len(shared) == 1 and "one process" in shared[0]
    cores = flags(_row(devices=4, device_names=[f"cpu:{i}" for i in range(4)]), base, 1.5)
    assert len(cores) == 1 and "4 ranks x 1 thread(s) share 2 cores" in cores[0]
    assert flags(_row(strategy="scratch"), base, 1.01) == []  # within the noise
    assert "warm-up included" in flags(_row(steady=False), base, 0.5)[0]
    assert "resumed" in refuse_baseline(_row(), _row(id="b", resumed=True))
    assert refuse_baseline(_row(), _row(id="b")) is None
    assert "baseline b has no steady" in flags(_row(), _row(id="b", steady=False), 0.5)[0]


def test_predict_end_to_end_measures_once_then_uses_the_kept_figures(tmp_path):
    env = dict(os.environ, GPUTUI_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "gputui", "predict", "quickstart", "--devices", "1,2",
           "--strategies", "dp", "--set", "model.name=mlp", "--set", "optim.batch_size=16",
           "--json"]
    runs = ["--runs-dir", str(tmp_path / "runs")]
    first = subprocess.run(cmd + runs, capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "measured 1 x single(16 per step" in first.stderr
    rows = {(r["strategy"], r["devices"]): r for r in json.loads(first.stdout)["rows"]}
    single, dp = rows[("single", 1)], rows[("dp", 2)]
    assert single["step_time_s"] > 0 and single["speedup"] == pytest.approx(1.0)
    assert dp["speedup"] == pytest.approx(1.0) and dp["formula"].startswith("t_1 (cpu")
    inputs = json.loads(first.stdout)["inputs"]
    assert inputs and all(i["source"] == "measured now" for i in inputs)
    # kept figures measured on a quiet machine are read back, each named with its age (a
    # busy machine's would be measured again: see test_trust)
    cache = next((tmp_path / "cache").glob("predict-*.json"))
    kept = json.loads(cache.read_text())
    for v in kept.values():
        v["machine"] = dict(v["machine"], contended=False)
    cache.write_text(json.dumps(kept))
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and "  measured " not in again.stderr
    assert "compute single, batch 16" in again.stderr and ": cached, measured 20" in again.stderr
    assert json.loads(again.stdout)["rows"][0]["step_time_s"] == single["step_time_s"]
    bad = subprocess.run(cmd[:-1] + ["--strategies", "model_parallel"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "ddp" in bad.stderr


def test_a_resumed_baseline_is_refused_and_repeats_pair_each_pass(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from run_records import write_record

    from gputui.runs.compare.table import compare, summary_lines
    from gputui.runs.sweep.repeats import grouped
    from gputui.runs.sweep.runner import Point

    runs = tmp_path / "runs"
    resumed = write_record(runs, "20260101-090000-exp-res", "single", 1, sps=100)
    cfg = resumed / "config.toml"
    cfg.write_text(cfg.read_text().replace('resume_from = ""', 'resume_from = "runs/old"'))
    ddp = write_record(runs, "20260101-100000-exp-d1", "ddp", 2, sps=900, windows=2)
    (item,) = compare([ddp], runs)
    assert item.speedup is None and "resumed run" in item.refused[0]
    assert "refused: " in summary_lines([item])[0]
    # two passes under different loads: each pass's pair gives 0.9x; unpaired 0.45x-1.8x
    ids = {"s1": 1000, "d1": 900, "s2": 500, "d2": 450}
    dirs = {k: write_record(runs, f"20260101-1{i}0000-exp-{k}", "single" if k[0] == "s"
                            else "ddp", 1 if k[0] == "s" else 2, sps=v, windows=2)
            for i, (k, v) in enumerate(ids.items(), start=1) if k != "d1"} | {"d1": ddp}
    points = [Point("single" if k[0] == "s" else "ddp", k[0], "cpu", "finished",
                    run_id=dirs[k].name, rep=int(k[1])) for k in ids]
    rows = {r["strategy"]: r for r in grouped(compare(list(dirs.values()), runs), points)}
    ddp_row = rows["ddp"]
    assert ddp_row["speedup_spread"] == {"median": 0.9, "min": 0.9, "max": 0.9, "n": 2} or \
        ddp_row["speedup_spread"]["median"] == pytest.approx(0.9)
    assert ddp_row["speedup_spread"]["min"] == pytest.approx(0.9)
    assert ddp_row["speedup_spread"]["max"] == pytest.approx(0.9)
    assert ddp_row["repeats"] == 2 and ddp_row["check"] == ""
    assert rows["single"]["samples_spread"]["min"] == 500


def test_sweep_repeat_and_predict_bad_input_is_one_line(capsys):
    from gputui import cli

    assert cli.main(["sweep", "quickstart", "--repeat", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--repeat 0" in err
    assert cli.main(["sweep", "quickstart", "--predict", "--strategies", "single"]) == 2
    assert "no strategy that has a prediction" in capsys.readouterr().err


def test_the_one_rank_measurement_leaves_out_its_warm_up_comm(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from run_records import write_record

    from gputui.core.breakdown import make
    from gputui.runs.predict.measure import _steady_comm

    parts = [make(0.010, 0.0, 0.002, 0.001, comm) for comm in (0.5, 0.002, 0.004)]
    run = write_record(tmp_path, "r", strategy="ddp", epochs=3, breakdowns=parts)
    assert _steady_comm(run) == pytest.approx(0.003)  # the first (warm-up) window left out
    assert _steady_comm(write_record(tmp_path, "s", epochs=2)) == 0.0  # none measured


def test_fsdp_units_are_the_mlps_three_layers_as_the_fsdp_strategy_wraps_them():
    from gputui.core.config import RunConfig, apply_overrides
    from gputui.train.comm_ranks import fsdp_units

    cfg = apply_overrides(RunConfig(), [("t", "model.name", "mlp"),
                                        ("t", "data.name", "synthetic")])
    # Linear 784->256, 256->128, 128->10 (weights and biases, float32), no root parameters
    assert fsdp_units(cfg.to_dict(), 2) == ([(256 * 784 + 256) * 4, (128 * 256 + 128) * 4,
                                             (10 * 128 + 10) * 4], 0)
    units, _ = fsdp_units(cfg.to_dict(), 3)  # 256 rows padded to 258, 10 to 12
    assert units[0] == (258 * 784 + 258) * 4 and units[2] == (12 * 128 + 12) * 4


def test_the_issues_impossible_prediction_is_flagged_as_compare_flags_it():
    """The issue's inputs: one 2-thread step of 1,818 ms (spinning under load), two 1-thread
    half-batch ddp steps of 84.6 ms: 18x, 907 % efficiency, flagged by compare's rule."""
    from gputui.cli.predict import flag_lines
    from gputui.runs.predict.scaling import impossible

    inp = Inputs(n=2, on_gpu=False, batch=64, batch_1=64, t_1=1.818, t_c=0.0846,
                 t_own={"ddp": 0.0846}, t_ar=0.001, t_sync=0.0001, params=1000)
    p = predict("ddp", inp)
    assert p.speedup == pytest.approx(21.4, rel=0.05) or p.speedup > 10
    (why,) = impossible(p, inp, cores=2)
    assert "exceeds 100 %" in why and "t_1 (1,818.0 ms a step on one device)" in why
    assert "--measure-again" in why and "measure both in one sweep" not in why
    row = dict(p.to_dict(), devices=2, flags=[why])
    assert flag_lines([row])[0].startswith("ddp on 2: FLAGGED, predicted speedup ")
    fair = replace(inp, t_1=0.16)  # about twice the half-batch step: a plausible 1.9x
    assert impossible(predict("ddp", fair), fair, cores=2) == []
    assert impossible(predict("single", replace(inp, n=1)), replace(inp, n=1), cores=2) == []


def test_a_kept_step_measured_with_other_waiting_is_measured_again(monkeypatch):
    from gputui.runs.predict.inputs import stale

    kept = {"step_time_s": 0.1, "machine": {"contended": False}, "measured_t": 1.0}
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # runs wait passively (default)
    assert "threads waiting active" in stale(kept)  # kept before the waiting was recorded
    assert stale(dict(kept, omp_wait="passive (gputui's default)")) is None
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert "runs now wait active" in stale(dict(kept, omp_wait="passive (gputui's default)"))


@pytest.mark.slow
def test_a_slow_kept_baseline_makes_predict_and_compare_flag_the_prediction(tmp_path):
    """Really measured inputs for ddp on 2, then t_1 kept 40x slower (as a spinning 2-thread
    step beside other work was): predict shows the speedup as flagged, with the reason and
    the remedy, and compare gives no predicted figure to fall short of."""
    sys.path.insert(0, os.path.dirname(__file__))
    from run_records import write_record

    from gputui.runs.compare.table import compare

    runs = tmp_path / "runs"
    ddp = write_record(runs, "20260101-100000-exp-d2", "ddp", 2, batch=32, sps=900, epochs=3,
                       model="mlp", windows=2)
    env = dict(os.environ, GPUTUI_CACHE_DIR=os.environ["GPUTUI_CACHE_DIR"])
    cmd = [sys.executable, "-m", "gputui", "predict", str(ddp / "config.toml"), "--devices",
           "1,2", "--strategies", "ddp", "--runs-dir", str(tmp_path / "measure")]
    first = subprocess.run(cmd + ["--json"], capture_output=True, text=True, env=env,
                           timeout=600)
    assert first.returncode == 0, first.stderr
    assert "flags" in json.loads(first.stdout)["rows"][1]
    cache = next(Path(os.environ["GPUTUI_CACHE_DIR"]).glob("predict-*.json"))
    kept = json.loads(cache.read_text())
    for v in kept.values():  # as if measured on a quiet machine: read back, not measured again
        v["machine"] = dict(v["machine"], contended=False)
    (key,) = [k for k in kept if k.startswith("compute|") and "|b32|" in k and "|x1|" in k
              and "@1" not in k]
    kept[key]["step_time_s"] *= 40
    cache.write_text(json.dumps(kept))
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "flagged" in again.stdout and "ddp on 2: FLAGGED, predicted speedup" in again.stdout
    assert "--measure-again" in again.stdout
    single = write_record(runs, "20260101-090000-exp-s1", "single", 1, batch=32, sps=500,
                         epochs=3, model="mlp", windows=2)
    item = compare([single, ddp], runs)[1]
    assert item.speedup == pytest.approx(1.8) and item.predicted_speedup is None
    assert "is no result: efficiency" in item.predicted_reason


def test_fsdps_timed_collectives_are_the_ones_this_torch_has(monkeypatch):
    """torch 2.13's fully_shard calls ``dist.all_gather_single`` and
    ``reduce_scatter_single``; 2.11 (the oldest supported, the GPU machines') has only
    ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, the same arguments: the timing
    takes the one this torch has (an AttributeError on 2.11 before)."""
    import torch.distributed as dist

    from gputui.train.comm_ranks import _single

    if hasattr(dist, "all_gather_single"):
        assert _single("all_gather", "all_gather_into_tensor") is dist.all_gather_single
        assert _single("reduce_scatter", "reduce_scatter_tensor") is dist.reduce_scatter_single
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    assert _single("all_gather", "all_gather_into_tensor") is dist.all_gather_into_tensor
    assert _single("reduce_scatter", "reduce_scatter_tensor") is dist.reduce_scatter_tensor


def test_a_strategy_the_run_would_refuse_is_no_prediction_and_not_measured(tmp_path):
    """quickstart's pp on 2 devices (1f1b with one micro-batch): `gputui run` refuses it, so
    predict says why instead of a speedup (it had said 0.59x)."""
    from gputui.cli.predict import predict_grid
    from gputui.core.config import load_preset
    from gputui.core.presets import resolve_preset

    cfg = load_preset(resolve_preset("quickstart"))
    said: list[str] = []
    rows = predict_grid(cfg, [2], ["pp"], "cpu", tmp_path, said.append, measure=False)
    pp = next(r for r in rows if r["strategy"] == "pp")
    assert pp["step_time_s"] is None and pp["speedup"] is None
    assert pp["reason"].startswith("cannot run: strategy.schedule = '1f1b' needs "), pp
