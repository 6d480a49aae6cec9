"""ddp and fsdp on 2 real gloo ranks against single: same global batches, same seed, same
parameters after several steps (fp32), even, odd and uneven shards, with accumulation; and a
bf16 ddp run that trains. All scenarios share one elastic launch (ddp_scenarios.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_scenarios import SCENARIOS, STEPS
from gputui.train.models import build_model
from rounding import assert_equal_within_rounding
import strategy_harness as harness
from strategy_harness import assert_params_close, make_config, params, run_steps

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """{rank: {scenario: {"params", "losses", "acc", "test_loss", "batch_size"}}} from one
    2-rank launch."""
    out = tmp_path_factory.mktemp("ddp") / "scenarios.pt"
    proc = subprocess.run([sys.executable, str(HERE / "ddp_scenarios.py"), str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def single_reference(model: str, batch: int, **extra):
    """The single-device run of the same global batches: the strategy (which carries its
    rounding bound, rounding.py), losses, (test accuracy or a language model's validation
    loss, and the test loss); strategy_harness keeps it per config."""
    return harness.single_reference(make_config("single", "cpu", model, batch, **extra), STEPS)


def initial_model(model: str):
    """The scenario model as every strategy builds it before its first step."""
    if model == "gpt":
        from gputui.train.models import gpt_shape

        cfg = make_config("single", "cpu", "gpt", 16)
        return build_model("gpt", 1, 32, 256, seed=3,
                           shape=gpt_shape(cfg.model, cfg.data.context, 256))
    return build_model(model, 1, 28, 10, seed=3, init="default")


@pytest.mark.parametrize("name", ["ddp_even", "ddp_odd", "ddp_uneven", "ddp_micro", "fsdp",
                                  "fsdp_micro", "ddp_compiled", "ddp_gpt", "fsdp_gpt"])
def test_equals_single(ranks, name):
    _, model, batch, _, _ = SCENARIOS[name]
    single, ref_losses, ref_acc = single_reference(model, batch)
    reference = params(single.model)
    init = params(initial_model(model))
    assert max((reference[k] - init[k]).abs().max().item() for k in init) > 1e-3  # it trained
    for rank in (0, 1):  # every rank holds the same full-batch update
        got = ranks[rank][name]
        assert got["batch_size"] == batch  # the global batch, not a per-rank one
        assert_equal_within_rounding(got["params"], single)
        assert got["losses"] == pytest.approx(ref_losses, rel=1e-5)
        # evaluation split over the ranks and all-reduced (a language model's validation
        # loss is a sum of floats in another order: equal within rounding)
        assert (got["acc"], got["test_loss"]) == pytest.approx(ref_acc, rel=1e-6)


@pytest.mark.parametrize("name", ["ddp_adamw", "fsdp_adamw"])
def test_adamw_with_warmup_cosine_and_clipping_equals_single(ranks, name):
    """AdamW at a warm-up then cosine lr, clipped on every step: ddp by its averaged
    gradients, fsdp by the norm of its gradient shards (a DTensor norm made whole over the
    mesh), both as single clips by its full gradient."""
    _, model, batch, extra, _ = SCENARIOS[name]
    single, ref_losses, _ = single_reference(model, batch, **extra)
    for rank in (0, 1):
        got = ranks[rank][name]
        assert_equal_within_rounding(got["params"], single)
        assert got["losses"] == pytest.approx(ref_losses, rel=1e-5)


def test_fsdp_adamw_checkpoint_restores_the_optimizer_and_the_schedule(ranks):
    for rank in (0, 1):
        got = ranks[rank]["fsdp_adamw"]
        assert_params_close(got["resumed_params"], got["params"], rtol=0, atol=0)
        assert got["resumed_steps"] == STEPS and got["resumed_opt_steps"] == [float(STEPS)]


@pytest.mark.parametrize("name", ["ddp_user", "fsdp_user", "fsdp_user_transformer"])
def test_a_user_model_equals_single(ranks, name):
    _, model, batch, extra, _ = SCENARIOS[name]
    same = {k: v for k, v in extra.items() if k.startswith(("model.", "data."))}
    strategy, ref_losses, _ = single_reference(model, batch, **same)
    reference = params(strategy.model)
    assert any(k.startswith("blocks.1.") for k in reference)  # the user's Net, not LeNet
    for rank in (0, 1):
        got = ranks[rank][name]
        assert_equal_within_rounding(got["params"], strategy)
        assert got["losses"] == pytest.approx(ref_losses, rel=1e-5)


def test_scale_with_devices_multiplies_batch_and_lr_by_the_world_size(ranks):
    strategy, losses = run_steps(make_config("single", "cpu", "lenet", 32, **{"optim.lr": 0.2}),
                                 STEPS)
    got = ranks[0]["ddp_scaled"]
    assert got["batch_size"] == 32  # 16 per device x 2 ranks, lr 0.1 x 2
    assert_equal_within_rounding(got["params"], strategy)
    assert got["losses"] == pytest.approx(losses, rel=1e-5)


def test_each_rank_takes_its_shard(ranks):
    assert [ranks[r]["ddp_uneven"]["shard"] for r in (0, 1)] == [32, 8]  # split_weights 0.8/0.2
    assert [ranks[r]["ddp_odd"]["shard"] for r in (0, 1)] == [13, 12]


def test_ranks_hold_identical_replicas(ranks):
    for name in ("ddp_even", "ddp_uneven"):
        a, b = ranks[0][name]["params"], ranks[1][name]["params"]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_ddp_trains(ranks):
    losses = ranks[0]["ddp_bf16"]["losses"]
    assert len(losses) == 6 * STEPS and all(l == l for l in losses)  # no NaN
    first, last = sum(losses[:STEPS]) / STEPS, sum(losses[-STEPS:]) / STEPS
    assert last < first - 0.05, (first, last)
    assert ranks[0]["ddp_bf16"]["acc"] > 0.25  # chance is 0.1


def test_fsdp_checkpoint_restores_the_full_parameters(ranks):
    """Saved from the shards (gathered on rank 0 only), loaded into a fresh fsdp on both ranks."""
    for rank in (0, 1):
        got = ranks[rank]["fsdp"]
        assert_params_close(got["resumed_params"], got["params"], rtol=0, atol=0)


def test_fsdp_ranks_hold_half_of_ddps_training_memory(ranks):
    """Same model (lenet), same optimizer: each fsdp rank counts about half of a ddp rank's
    parameter, gradient and optimizer bytes (the shards may be padded); ddp's equal a full
    model's, by hand: SGD with momentum keeps one buffer per parameter."""
    model = build_model("lenet", 1, 28, 10, seed=3, init="default")
    full = sum(p.numel() * 4 for p in model.parameters())
    ddp, fsdp = ranks[0]["ddp_even"]["memory"], ranks[0]["fsdp"]["memory"]
    assert [r["device"] for r in ddp] == [r["device"] for r in fsdp] == ["cpu:0", "cpu:1"]
    for d, f in zip(ddp, fsdp):
        assert d["params"] == d["grads"] == d["optim"] == full
        for part in ("params", "grads", "optim"):
            assert 0.45 * full <= f[part] <= 0.55 * full, (part, f[part], full)
    assert sum(r["params"] for r in fsdp) >= full  # the shards cover the whole model


# ---------------------------------------------------------------- the step breakdown
def _median_part(ranks, scenario: str, part: str) -> float:
    """The median over both ranks and the metered steps (the first, warm-up, left out) of one
    part of the breakdown, as the loop recorded it on rank 0 (every rank's row, gathered)."""
    from statistics import median

    steps = ranks[0]["breakdown"][scenario][1:]
    return median(row.breakdown.part(part) for rows in steps for row in rows)


def test_ddp_breakdown_parts_add_up_to_the_step_on_every_rank(ranks):
    from gputui.core.breakdown import total

    for scenario, steps in ranks[0]["breakdown"].items():
        assert len(steps) == 10  # log_every 1: every step metered
        for rows in steps:
            assert [r.rank for r in rows] == [0, 1]
            for row in rows:
                bd = row.breakdown
                assert bd.step_s > 0 and bd.compute_s > 0 and bd.optimizer_s > 0
                assert bd.comm_exposed_s is not None and bd.comm_overlap_s is not None
                assert total(bd) == pytest.approx(bd.step_s, rel=1e-9, abs=1e-12), scenario


def test_a_delay_in_ddp_communication_shows_as_exposed_comm(ranks):
    from ddp_scenarios import DELAY

    grown = (_median_part(ranks, "comm_delay", "comm_exposed_s")
             - _median_part(ranks, "plain", "comm_exposed_s"))
    assert grown >= 0.7 * DELAY, grown  # the step waits for the whole of it


def test_a_delay_in_the_data_path_shows_as_data(ranks):
    from ddp_scenarios import DELAY

    grown = _median_part(ranks, "data_delay", "data_s") - _median_part(ranks, "plain", "data_s")
    assert grown >= 0.7 * DELAY, grown


def test_ddp_allreduce_bandwidth_is_its_gradient_bytes_over_its_comm_time(ranks):
    """Each rank all-reduces exactly the model's gradient bytes per step (LeNet fits one
    bucket), its bandwidth is those bytes over the comm time, and a delay held on the bucket
    lowers it to bytes / (time + delay)."""
    from statistics import median

    from ddp_scenarios import DELAY

    model = build_model("lenet", 1, 28, 10, seed=3, init="default")
    full = sum(p.numel() * 4 for p in model.parameters())

    def rows(scenario):
        return [row for rows in ranks[0]["breakdown"][scenario][1:] for row in rows]

    for scenario in ("plain", "comm_delay"):
        for row in rows(scenario):
            assert row.comm_bytes == full, (scenario, row)
            assert row.comm_gbps == pytest.approx(full / row.comm_s / 1e9)
    plain = median(r.comm_s for r in rows("plain"))
    slow = median(r.comm_gbps for r in rows("comm_delay"))
    assert slow == pytest.approx(full / (plain + DELAY) / 1e9, rel=0.3)
    assert slow < median(r.comm_gbps for r in rows("plain"))


def test_a_delay_in_fsdps_collectives_shows_as_exposed_comm(ranks):
    """fsdp's all-gathers and reduce-scatters, timed through torch's custom-collective API,
    are split out of compute: each held back FSDP_DELAY grows the exposed part by as much,
    compute stays."""
    from statistics import median

    from ddp_scenarios import FSDP_DELAY

    def rows(scenario):
        return [row for rows in ranks[0]["breakdown"][scenario][1:] for row in rows]

    plain, slow = rows("fsdp_plain"), rows("fsdp_comm_delay")
    counts = {row.comm_calls for row in plain + slow}
    assert len(counts) == 1  # the same collectives every step, on every rank
    (calls,) = counts
    assert calls >= 3  # an all-gather for forward and for backward, a reduce-scatter at least
    assert all(row.breakdown.comm_exposed_s > 0 for row in plain)
    part = {name: {k: median(r.breakdown.part(k) for r in rs) for k in ("comm_exposed_s",
                                                                       "compute_s", "step_s")}
            for name, rs in (("plain", plain), ("slow", slow))}
    grown = part["slow"]["comm_exposed_s"] - part["plain"]["comm_exposed_s"]
    # at least the delays held back (a sleep never returns early); at most what the step
    # itself grew by (no delay counted twice): a loaded machine oversleeps each delay, so
    # the step's own growth, not a multiple of FSDP_DELAY, is the upper bound
    step_grown = part["slow"]["step_s"] - part["plain"]["step_s"]
    assert 0.7 * calls * FSDP_DELAY <= grown <= step_grown + 0.5 * calls * FSDP_DELAY, \
        (grown, step_grown, calls)
    assert part["slow"]["compute_s"] < part["plain"]["compute_s"] + 0.5 * calls * FSDP_DELAY
    assert plain[0].comm_gbps is None  # no all-reduce: no bandwidth beside bench-comm's


# ---------------------------------------------------------------- stragglers and the waterfall
def _steps(ranks, scenario: str) -> list:
    return ranks[0]["breakdown"][scenario]


@pytest.mark.parametrize("scenario", ["slow_rank", "fsdp_slow_rank"])
def test_a_rank_slow_in_backward_is_named_with_its_phase_and_the_wait_it_caused(ranks, scenario):
    """debug.slow_rank = 1 sleeps SLOW_MS in that rank's backward only: the rows name rank 1
    and backward, and rank 0 waited about that long in the collective (at least half of it,
    at most the step: a loaded machine stretches both ways)."""
    from statistics import median

    from ddp_scenarios import SLOW_MS

    from gputui.core import straggler

    found = [straggler.find(rows) for rows in _steps(ranks, scenario)]
    assert all(s is not None for s in found)
    run = straggler.over_steps(found)
    assert run is not None and (run.rank, run.device, run.phase) == (1, "cpu:1", "backward")
    assert run.significant() and run.agree >= 0.7
    assert 0.5 * SLOW_MS / 1000 <= run.wait_s <= run.step_s, run
    assert "straggler: rank 1 (cpu:1), in backward" in straggler.line(run)
    # the slow rank's own backward holds the delay (medians: a loaded machine slows a step)
    mine = median(rows[1].backward_s - rows[0].backward_s for rows in _steps(ranks, scenario))
    assert mine >= 0.5 * SLOW_MS / 1000, mine


@pytest.fixture(scope="module")
def single_step():
    """single's mean metered step on the scenarios' model and batch, in this process."""
    from test_breakdown import _run

    from gputui.core import breakdown

    return breakdown.mean(e.per_device[0].breakdown for e in _run("single", "cpu")[1:])


@pytest.mark.parametrize("scenario,cause,delay_s", [
    ("slow_rank", "straggler", None), ("fsdp_slow_rank", "straggler", None),
    ("data_delay", "data", "DELAY"), ("comm_delay", "comm", "DELAY")])
def test_each_injected_delay_lands_in_its_waterfall_bar(ranks, single_step, scenario, cause,
                                                        delay_s):
    """The waterfall of each delayed 2-rank run against single on the same global batch (in
    this process): the bars add up to the measured speedup, and the delayed cause's bar is at
    least half of what the delay alone takes from the ideal 2x (2 x delay / step; a
    straggler's wait is spread over the two ranks: 2 x delay / 2 / step)."""
    import ddp_scenarios

    from gputui.core import breakdown, straggler
    from gputui.runs.compare import waterfall

    steps = _steps(ranks, scenario)[1:]
    bd = breakdown.mean(row.breakdown for rows in steps for row in rows)
    slow = straggler.over_steps([straggler.find(rows) for rows in _steps(ranks, scenario)])
    single = single_step
    assert bd is not None and single is not None
    measured = single.step_s / bd.step_s  # the same global batch of 32: step time ratio
    wf = waterfall.build(2.0, measured, waterfall.shares(bd, slow), waterfall.shares(single))
    assert wf.ideal - sum(v for _, v in wf.bars) == pytest.approx(measured)
    delay = ddp_scenarios.SLOW_MS / 2000 if delay_s is None else getattr(ddp_scenarios, delay_s)
    assert wf.lost(cause) >= 0.5 * 2.0 * delay / bd.step_s, (wf, bd)


@pytest.mark.parametrize("scenario, kinds", [
    ("plain", {"ddp all-reduce"}),
    ("fsdp_plain", {"fsdp all-gather", "fsdp reduce-scatter"}),
])
def test_each_collective_is_named_where_it_runs(ranks, scenario, kinds):
    """Every rank's metered step names its collectives: ddp's bucket all-reduces, fsdp's
    all-gathers and reduce-scatters; the named spans lie within the rank's comm time (overlaps
    of several kinds merged there, summed here)."""
    from gputui.core.breakdown import collectives_line

    for rows in ranks[0]["breakdown"][scenario][1:]:
        for row in rows:
            assert set(row.collectives) == kinds, row.collectives
            assert all(v > 0 for v in row.collectives.values())
            assert max(row.collectives.values()) <= row.comm_s + 1e-9
            assert sum(row.collectives.values()) >= row.comm_s - 1e-9
            assert all(k in collectives_line(row) for k in kinds)


def test_a_rank_stopped_by_another_records_that_ranks_reason(ranks):
    """The stop agreement carries the asking rank's reason: the rank that had not seen the
    signal yet records it, marked as another rank's; a reason outside the shared table
    travels as 'stopped on another rank'; a rank's own reason is its own."""
    sigterm = "stopped by SIGTERM"
    assert [r["agreed_stops"] for r in (ranks[0], ranks[1])] == [
        [{"stop": True, "reason": f"{sigterm} (on another rank)"},
         {"stop": True, "reason": "stopped by user"},
         {"stop": True, "reason": "stopped by user"},
         {"stop": True, "reason": "something else"}],
        [{"stop": True, "reason": sigterm},
         {"stop": True, "reason": "stopped by user (on another rank)"},
         {"stop": True, "reason": "something else"},
         {"stop": True, "reason": "stopped on another rank"}]]
    # a reason the table does not name travels lowest: a named one asked elsewhere wins
    from gputui.train.stopping import reason_code

    assert 0 < reason_code("something else") < reason_code("stopped by user") < \
        reason_code(sigterm)
