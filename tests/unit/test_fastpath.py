"""The fast path: run.compile and run.channels_last equal the eager fp32 run (float32
tolerance), compile time is reported apart, and a failed compile falls back or stops as asked.

Compiling uses inductor on the CPU (it needs a C++ compiler, present here); the models are
small (mlp) so each compile takes seconds, not minutes. ddp's compiled run is a scenario of
test_equivalence_ddp (one launch for all); fsdp and dp train eager and say so.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch

from gputui.train import strategies
from gputui.core.runstore import read_events
from gputui.hw.discovery import resolve_devices
from gputui.train.data import TensorBatches
from gputui.train.strategies import fastpath
from strategy_harness import assert_params_close, make_config, params, run_steps, small_data

STEPS = 4


def compiled_steps(cfg, steps: int = STEPS):
    """Set up like a run (compile before the first step), train ``steps`` steps; returns
    (strategy, losses, compile seconds, events emitted)."""
    ds = small_data()
    strategy = strategies.load(cfg.strategy.name)(cfg, resolve_devices(cfg.devices.spec),
                                                      ds.in_channels, ds.image_size,
                                                      ds.num_classes)
    strategy.setup()
    events = []
    seconds = fastpath.compile_ahead(strategy, ds, events.append)
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device(), channels_last=cfg.run.channels_last)
    losses = [strategy.train_step(x, y).item()
              for x, y in itertools.islice(batches.epoch(1), steps)]
    return strategy, losses, seconds, events


def graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,spec", [("single", "cpu"), ("scratch", "cpu*2"),
                                           ("model_parallel", "cpu*2")])
def test_compiled_run_equals_eager(strategy, spec):
    eager, eager_losses = run_steps(make_config(strategy, spec, "mlp", 32), STEPS)
    before = graphs()
    got, losses, seconds, events = compiled_steps(
        make_config(strategy, spec, "mlp", 32, **{"run.compile": "default"}))
    assert graphs() > before  # something was really compiled, not silently run eager
    assert seconds > 0 and not [e for e in events if e.kind == "log"]
    assert_params_close(params(got.primary_model()), params(eager.primary_model()))
    assert losses == pytest.approx(eager_losses, rel=1e-5)


def test_channels_last_equals_the_default_format():
    eager, eager_losses = run_steps(make_config("single", "cpu", "lenet", 32), STEPS)
    got, losses, seconds, _ = compiled_steps(
        make_config("single", "cpu", "lenet", 32, **{"run.channels_last": True}))
    assert seconds == 0.0  # nothing to compile
    conv = got.model[1][0].weight  # (the first conv has one input channel: both formats)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    batches = TensorBatches(torch.randn(64, 3, 8, 8), torch.zeros(64, dtype=torch.long), 32, 3,
                            channels_last=True)
    x, _ = next(iter(batches.epoch(1)))
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert_params_close(params(got.model), params(eager.model))
    assert losses == pytest.approx(eager_losses, rel=1e-5)


def run_without_compiler(tmp_path, *settings: str):
    """`gputui run` with inductor's C++ compiler pointed at a file that does not exist (and a
    fresh compile cache, so nothing compiled before can stand in): (exit code, stdout, stderr,
    the run's events)."""
    env = dict(os.environ, CXX="/nonexistent/g++", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ic"))
    proc = subprocess.run(
        [sys.executable, "-m", "gputui", "run", "quickstart", "--devices", "cpu", "--epochs", "1",
         "--runs-dir", str(tmp_path / "runs"), "--set", "model.name=mlp", "--set",
         "data.train_size=256", "--set", "data.test_size=64", "--set", "telemetry.enabled=false",
         "--set", "run.compile=default", *[a for s in settings for a in ("--set", s)]],
        capture_output=True, text=True, timeout=300, env=env)
    (run_dir, ) = (tmp_path / "runs").iterdir()
    return proc.returncode, proc.stdout, proc.stderr, read_events(run_dir)


@pytest.mark.slow
def test_a_failed_compile_falls_back_to_eager_with_one_line(tmp_path):
    code, out, err, events = run_without_compiler(tmp_path)
    assert code == 0, err
    (line, ) = [e for e in events if e.kind == "log" and "torch.compile" in e.message]
    assert line.level == "warning" and "\n" not in line.message
    assert line.message.startswith('torch.compile (mode "default") failed: ')
    assert line.message.endswith('training eager instead (run.compile_fallback = "eager")')
    assert line.message in out
    assert events[-1].kind == "run_finished"


@pytest.mark.slow
def test_a_failed_compile_stops_the_run_when_asked(tmp_path):
    code, out, err, events = run_without_compiler(tmp_path, "run.compile_fallback=fail")
    assert code == 1
    end = events[-1]
    assert end.kind == "run_failed" and "\n" not in end.reason
    assert end.reason.startswith('torch.compile (mode "default") failed: ')
    assert end.reason.endswith('set run.compile = "off" or run.compile_fallback = "eager"')
    assert not [e for e in events if e.kind == "step"]


@pytest.mark.parametrize("strategy,spec", [("dp", "cpu*2")])
def test_strategies_that_do_not_compile_say_so_and_train_eager(strategy, spec):
    eager, _ = run_steps(make_config(strategy, spec, "mlp", 32), STEPS)
    got, _, seconds, _ = compiled_steps(
        make_config(strategy, spec, "mlp", 32, **{"run.compile": "default"}))
    assert seconds == 0.0
    assert any("run.compile does not apply to dp" in n for n in got.notes)
    assert_params_close(params(got.primary_model()), params(eager.primary_model()))


def _combination(compile_mode: str, channels_last: bool, precision: str):
    marks = [pytest.mark.slow] if compile_mode != "off" else []  # inductor: seconds per graph
    return pytest.param(compile_mode, channels_last, precision, marks=marks,
                        id=f"{compile_mode}-{'cl' if channels_last else 'nchw'}-{precision}")


# Every eager combination, and compiled ones that pair compile with each level of the other two
# factors (a strength-2 covering: every pair of settings meets in some run; inductor costs
# tens of seconds per graph on a CPU). fp16 is refused on CPU devices (plan.validate); its
# combinations run on a GPU (below).
COMBINATIONS = [
    *(("off", cl, p) for cl, p in itertools.product((False, True), ("fp32", "bf16"))),
    ("default", True, "fp32"),  # the pair that once failed: compile x channels_last
    ("default", False, "bf16"),
]


@pytest.mark.parametrize("compile_mode,channels_last,precision",
                         [_combination(*c) for c in COMBINATIONS])
def test_every_fast_path_combination_trains_a_conv_model(compile_mode, channels_last,
                                                         precision):
    check_combination("cpu", compile_mode, channels_last, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("compile_mode,channels_last", itertools.product(("off", "default"),
                                                                         (False, True)))
def test_every_fp16_fast_path_combination_trains_a_conv_model_on_a_gpu(compile_mode,
                                                                        channels_last):
    check_combination("cuda:0", compile_mode, channels_last, "fp16")


def check_combination(spec: str, compile_mode: str, channels_last: bool, precision: str):
    """What the README says composes (run.compile x run.channels_last x run.precision), on
    LeNet: the run compiles (or not) without falling back, and its first steps' losses are the
    plain run's of the same precision."""
    _, eager_losses = run_steps(make_config("single", spec, "lenet", 32,
                                            **{"run.precision": precision}), 2)
    before = graphs()
    got, losses, seconds, events = compiled_steps(make_config(
        "single", spec, "lenet", 32, **{"run.compile": compile_mode,
                                        "run.channels_last": channels_last,
                                        "run.precision": precision}), 2)
    assert [e.message for e in events if e.kind == "log"] == []  # no fallback to eager
    if compile_mode == "off":
        assert seconds == 0.0
    else:
        assert seconds > 0 and graphs() > before
    conv = got.model[1][0].weight  # the first conv (one input channel: both formats)
    assert conv.is_contiguous(memory_format=torch.channels_last) == channels_last
    tolerance = 1e-5 if precision == "fp32" else 2e-2  # bf16/fp16 round each kernel's output
    assert losses == pytest.approx(eager_losses, rel=tolerance)
