"""`gputui verify`: each strategy against single, through the product's own paths.

In-process (fast): the loop keeps a trace under debug.trace_steps (gputui.train.paramtrace),
a sound strategy's trace matches single's, and one broken on purpose (debug.fault_strategy)
is named at the step it broke; the comparison's rules on traces whose answer is known.
Launched (slow): `gputui verify` on cpu*2 passes scratch and ddp with LeNet, and fails a
strategy broken on purpose (ddp, training a model of the user's own), naming the step
and the parameter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import user_model
from gputui.train import strategies
from gputui.hw.discovery import resolve_devices
from gputui.runs.verify_trace import Trace, compare, read_trace
from gputui.train.data import TensorBatches
from gputui.train.loop import train
from strategy_harness import data_for, make_config

STEPS = 3


def traced(tmp_path: Path, strategy: str, spec: str, name: str = "", **extra) -> Trace:
    """``strategy`` trained by the loop under debug.trace_steps; the trace it left."""
    cfg = make_config(strategy, spec, "mlp", 32, **{"debug.trace_steps": STEPS}, **extra)
    ds = data_for(cfg)
    s = strategies.load(strategy)(cfg, resolve_devices(spec), ds.in_channels,
                                      ds.image_size, ds.num_classes)
    s.setup()
    batches = TensorBatches(ds.train_x, ds.train_y, s.batch_size, cfg.run.seed)
    run_dir = tmp_path / (name or strategy)
    run_dir.mkdir()
    events: list = []
    assert train(cfg, s, batches, ds, events.append, lambda: False, run_dir) == "finished"
    return read_trace(run_dir)


def test_a_sound_strategy_matches_single_and_a_broken_one_is_named(tmp_path):
    ref = traced(tmp_path, "single", "cpu")
    assert len(ref.losses) == STEPS and ref.params is not None and len(ref.params) == STEPS + 1
    good = compare(ref, traced(tmp_path, "scratch", "cpu*2"), 1e-5, 1e-6)
    assert good.passed and good.steps == STEPS and good.max_param_diff < 1e-5
    broken = compare(ref, traced(tmp_path, "scratch", "cpu*2", "broken",
                                 **{"debug.fault_strategy": "scratch", "debug.fault_step": 2}),
                     1e-5, 1e-6)
    assert not broken.passed
    assert broken.first_step == 2 and broken.first_what in ref.names
    assert broken.max_param_diff > 1e-4


def _trace(steps: list[list[np.ndarray]], losses: list[float]) -> Trace:
    return Trace(["a", "b"], losses, steps, None, steps[-1])


def test_compare_names_the_first_step_and_the_parameter_most_off():
    a, b = np.ones(4, np.float32), np.full(3, 2.0, np.float32)
    ref = _trace([[a, b], [a, b], [a, b]], [1.0, 1.0])
    off = b.copy()
    off[1] += 0.01
    got = _trace([[a, b], [a + 1e-8, b], [a, off]], [1.0, 1.0])
    d = compare(ref, got, 1e-5, 1e-6)
    assert (d.first_step, d.first_what) == (2, "b")
    assert d.max_param_name == "b" and d.max_param_diff == pytest.approx(0.01, rel=1e-3)
    looser = compare(ref, got, 2e-2, 2e-3)  # bf16's tolerance lets it through
    assert looser.passed
    lossy = compare(ref, _trace([[a, b]] * 3, [1.0, 1.1]), 1e-5, 1e-6)
    assert (lossy.first_step, lossy.first_what) == (2, "loss")


def test_checksums_find_the_step_where_a_large_model_parted():
    a = np.linspace(-1, 1, 100)
    sums = lambda x: [x.sum(), (x * x).sum()]  # noqa: E731
    ref = Trace(["w"], [0.5, 0.5], None, np.array([[sums(a)], [sums(a)], [sums(a)]]), [a])
    moved = a + 1e-3
    got = Trace(["w"], [0.5, 0.5], None, np.array([[sums(a)], [sums(a)], [sums(moved)]]),
                [moved])
    d = compare(ref, got, 1e-5, 1e-6)
    assert (d.first_step, d.first_what) == (2, "w")
    assert compare(ref, ref, 1e-5, 1e-6).passed


PRESET = """[run]
name = "v"
seed = 3
[model]
name = "lenet"
init = "default"
[data]
name = "synthetic"
[optim]
batch_size = 32
lr = 0.1
momentum = 0.5
[devices]
spec = "cpu*2"
[strategy]
name = "ddp"
"""


def _verify(tmp_path, capsys, *flags: str) -> tuple[int, dict, str]:
    from gputui.cli import main

    preset = tmp_path / "v.toml"
    preset.write_text(PRESET)
    code = main(["verify", str(preset), "--devices", "cpu*2", "--steps", str(STEPS), "--json",
                 "--runs-dir", str(tmp_path / "runs"), *flags])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


@pytest.mark.slow
def test_verify_passes_scratch_and_ddp_on_two_cpu_devices(tmp_path, capsys):
    code, got, err = _verify(tmp_path, capsys, "--strategies", "scratch,ddp")
    assert code == 0, err
    assert [s["strategy"] for s in got["strategies"]] == ["scratch", "ddp"]
    for s in got["strategies"]:
        assert s["passed"] and s["steps"] == STEPS and s["max_param_diff"] < 1e-5
    assert "verify: ddp: pass" in err
    # single's and scratch's runs (one process each) ran in one warm host: only the first
    # paid for torch's import; ddp's ranks started fresh
    from gputui.core.runstore import read_events

    runs = tmp_path / "runs"
    scratch = next(e for e in read_events(runs / got["strategies"][0]["run_id"])
                   if e.kind == "init_done")
    assert got["single_run"] and scratch.import_s < 0.2, scratch


@pytest.mark.slow
def test_verify_fails_a_broken_strategy_and_names_step_and_parameter(tmp_path, capsys):
    # the user's own model (a model.factory), broken on purpose under ddp
    code, got, err = _verify(tmp_path, capsys, "--strategies", "ddp",
                             "--set", f"model.factory='{user_model.NET}'",
                             "--set", "debug.fault_strategy=ddp", "--set", "debug.fault_step=2")
    assert code == 1, err
    (s,) = got["strategies"]
    assert not s["passed"] and s["first_step"] == 2
    assert s["first_diverged"] and s["first_diverged"] != "loss"
    assert f"first diverged at step 2, parameter {s['first_diverged']}" in err


@pytest.mark.parametrize("flags,needle", [
    (["--strategies", "nope"], "'nope' is not a strategy"),
    (["--strategies", "model_parallel", "--devices", "cpu"], "model_parallel cannot run"),
    (["--steps", "0"], "--steps must be"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, flags, needle):
    code, _, err = _verify(tmp_path, capsys, *flags)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_the_tolerance_is_the_precisions_and_widens_for_adam_with_its_lr():
    from gputui.core.config import RunConfig
    from gputui.runs.verify import tolerance

    sgd = RunConfig()
    assert tolerance(sgd, 5) == (1e-5, 1e-6)
    assert tolerance(sgd.replace(run={"precision": "bf16"}), 5) == (2e-2, 2e-3)
    rtol, atol = tolerance(sgd.replace(optim={"name": "adamw", "lr": 3e-3}), 2)
    assert rtol == 1e-5 and atol == pytest.approx(1e-6 + 1e-3 * 3e-3 * 2)


def test_a_difference_is_the_arithmetics_only_where_the_control_shows_it_too():
    """The third verdict: beyond the tolerance, within the optimizer's bound, the losses
    equal, and every parameter that parted also parted when single only summed its batches
    in another order (the control)."""
    from gputui.runs.verify_trace import explain

    a, b = np.ones(4, np.float32), np.zeros(3, np.float32)
    ref = _trace([[a, b]] * 3, [1.0, 1.0])

    def moved(db: float, da: float = 0.0, losses=(1.0, 1.0)) -> Trace:
        return _trace([[a, b], [a + da, b + db], [a + da, b + db]], list(losses))

    control = moved(3e-4)  # b parts by rounding alone
    assert explain(ref, moved(1e-4), control, 1e-5, 1e-6, bound=0.01).startswith(
        "b moved apart by up to 0.0001, within the 0.01")
    assert explain(ref, moved(0.02), control, 1e-5, 1e-6, bound=0.01) is None  # past the bound
    assert explain(ref, moved(1e-4, da=1e-4), control, 1e-5, 1e-6, 0.01) is None  # a parted too
    assert explain(ref, moved(1e-4, losses=(1.0, 1.01)), control, 1e-5, 1e-6, 0.01) is None
    assert explain(ref, ref, control, 1e-5, 1e-6, 0.01) is None  # nothing to explain: a pass


def test_the_rounding_bound_is_adams_largest_step_twice_per_step():
    from gputui.core.config import RunConfig
    from gputui.runs.verify import rounding_bound

    assert rounding_bound(RunConfig(), 5) == 0.0  # sgd: rounding stays rounding-sized
    adamw = RunConfig().replace(optim={"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95]})
    assert rounding_bound(adamw, 5) == pytest.approx(2 * 3e-3 * 5)
    default = adamw.replace(optim={"betas": [0.9, 0.999]})  # (1 - b1) / sqrt(1 - b2) = 3.16
    assert rounding_bound(default, 5) == pytest.approx(2 * 3e-3 * 5 * 0.1 / 0.001 ** 0.5)


LM_PRESET = """[run]
name = "v"
[model]
factory = "{factory}"
[data]
name = "pystdlib"
context = 16
train_size = 256
test_size = 32
[optim]
batch_size = 16
name = "adamw"
lr = 0.003
[devices]
spec = "cpu*2"
[strategy]
name = "ddp"
"""


@pytest.mark.slow
def test_the_users_transformer_under_adamw_is_no_failure_of_ddp_but_a_fault_is(tmp_path, capsys):
    """The user's own transformer (nn.MultiheadAttention blocks) under AdamW: ddp's tiny
    float differences in the attention's key bias were reported FAIL ("ddp breaks my
    model"); they pass, or are ROUNDING with why; a fault on purpose still FAILs."""
    import user_lm
    from gputui.cli import main

    preset = tmp_path / "lm.toml"
    preset.write_text(LM_PRESET.format(factory=user_lm.TRANSFORMER))
    argv = ["verify", str(preset), "--strategies", "ddp", "--steps", "5", "--json",
            "--runs-dir", str(tmp_path / "runs")]
    code = main(argv)
    out, err = capsys.readouterr()
    (s,) = json.loads(out)["strategies"]
    assert code == 0 and s["result"] in ("pass", "rounding"), err
    if s["result"] == "rounding":
        assert "ddp: ROUNDING (no fault found): " in err and "attn.in_proj_bias" in s["rounding"]
    code = main([*argv, "--set", "debug.fault_strategy=ddp", "--set", "debug.fault_step=2"])
    out, err = capsys.readouterr()
    (s,) = json.loads(out)["strategies"]
    assert code == 1 and s["result"] == "fail" and "ddp: FAIL: first diverged at step " in err
