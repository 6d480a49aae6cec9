"""model_parallel's stage plan (balance by parameter count, split point checks), the registry's
view of dp and model_parallel, and both strategies end to end through the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from gputui.core.config import ConfigError
from gputui.core.mp_plan import MODEL_LAYERS, balance, check_split_points
from strategy_harness import make_config

GPUTUI = [sys.executable, "-m", "gputui"]


def gputui(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, *args], capture_output=True, text=True, timeout=300)


def largest_stage(counts, points):
    bounds = [0, *points, len(counts)]
    return max(sum(counts[a:b]) for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("counts,n,expected", [
    ([200, 25050, 102528, 1290], 2, [2]),  # LeNet's blocks: the dense layer alone is heaviest
    ([200, 25050, 102528, 1290], 3, [2, 3]),
    ([200960, 32896, 1290], 2, [1]),  # the MLP
    ([1, 1, 1, 1], 2, [2]),
    ([5, 1, 1, 1, 1, 1], 2, [1]),
    ([1, 1, 1, 1, 1, 5], 2, [5]),
    ([3, 3, 3], 3, [1, 2]),
])
def test_balance_known_cases(counts, n, expected):
    assert balance(counts, n) == expected


def test_balance_finds_the_smallest_largest_stage():
    """Against brute force over every possible cut, on many small layer lists."""
    import random

    rng = random.Random(7)
    for _ in range(300):
        layers = rng.randint(1, 7)
        counts = [rng.choice([0, 1, 10, 100, 1000]) * rng.randint(1, 9) for _ in range(layers)]
        n = rng.randint(1, layers)
        points = balance(counts, n)
        assert len(points) == n - 1 and points == sorted(set(points))
        assert all(0 < p < layers for p in points)
        best = min(largest_stage(counts, cut)
                   for cut in itertools.combinations(range(1, layers), n - 1))
        assert largest_stage(counts, points) == best, (counts, n, points)


def test_balance_refuses_more_stages_than_layers():
    with pytest.raises(ValueError, match="cannot cut 3 layers into 4 non-empty stages"):
        balance([1, 2, 3], 4)


def test_model_layers_match_the_models():
    from gputui.train.models import build_model

    for name, layers in MODEL_LAYERS.items():
        assert len(list(build_model(name, 1, 28, 10, seed=0).children())) == layers


@pytest.mark.parametrize("points,spec,message", [
    ([1, 2], "cpu*2", "strategy.split_points has 2 entries for 2 devices; give 1 (devices - 1), "
                      "or [] to balance by parameter count"),
    ([2, 2], "cpu*3", "strategy.split_points must be strictly increasing, got [2, 2]"),
    ([3, 1], "cpu*3", "strategy.split_points must be strictly increasing, got [3, 1]"),
    ([0], "cpu*2", "strategy.split_points[0] must be at least 1, got 0"),
    ([4], "cpu*2", "strategy.split_points must lie between 1 and 3 (lenet has 4 layers), "
                   "got [4]"),
    ([1.5], "cpu*2", "strategy.split_points[0] must be an integer, got 1.5; fix the value "
                       "(e.g. strategy.split_points = [])"),
    (["2"], "cpu*2", "strategy.split_points[0] must be an integer, got '2'; fix the value "
                         "(e.g. strategy.split_points = [])"),
])
def test_bad_split_points_give_one_line(points, spec, message):
    with pytest.raises(ConfigError) as info:
        make_config("model_parallel", spec, "lenet", 32, **{"strategy.split_points": points})
    assert str(info.value) == f"config: {message}"


@pytest.mark.parametrize("spec,model,extra,message", [
    ("cpu", "lenet", {}, "strategy 'model_parallel' needs at least 2 devices, devices.spec 'cpu' "
                         "gives 1; e.g. --devices cpu*2"),
    ("cpu*4", "mlp", {}, "strategy 'model_parallel' cuts mlp into at most 3 stages (one per "
                         "layer), devices.spec 'cpu*4' gives 4; use fewer devices"),
    ("cpu*2", "lenet", {"strategy.pipeline_chunks": 9, "optim.micro_batches": 4},
     "strategy.pipeline_chunks (9) is more than the 8 examples of each micro-batch; lower "
     "pipeline_chunks or raise optim.batch_size"),
    ("cpu*2", "lenet", {"strategy.split_weights": [0.5, 0.5]},
     "strategy.split_weights applies to scratch and ddp, not 'model_parallel'; remove it"),
])
def test_model_parallel_refuses_what_it_cannot_run(spec, model, extra, message):
    with pytest.raises(ConfigError) as info:
        make_config("model_parallel", spec, model, 32, **extra)
    assert str(info.value) == f"config: {message}"


def test_split_points_are_checked_in_the_training_process_too():
    """The worker rebuilds the config without the combination checks; setup still refuses."""
    from gputui.core.config import RunConfig, apply_overrides
    from gputui.hw.discovery import resolve_devices
    from gputui.train.strategies.model_parallel import ModelParallel

    cfg = apply_overrides(RunConfig(), [("t", "strategy.name", "model_parallel"),
                                        ("t", "devices.spec", "cpu*2"),
                                        ("t", "strategy.split_points", [3, 1])])
    with pytest.raises(ConfigError, match=r"^strategy.split_points has 2 entries for 2 devices"):
        ModelParallel(cfg, resolve_devices("cpu*2")).setup()


def test_check_split_points_accepts_valid_and_empty():
    assert check_split_points([], 4, 3) is None
    assert check_split_points([1, 3], 4, 3) is None
    assert check_split_points([5], 6, 2) is None


def test_strategies_json_lists_dp_and_model_parallel():
    two = {r["name"]: r for r in json.loads(gputui("strategies", "--devices", "cpu*2",
                                                   "--json").stdout)["strategies"]}
    assert two["dp"]["available"] and two["model_parallel"]["available"]
    assert not two["dp"]["multiprocess"] and not two["model_parallel"]["multiprocess"]
    assert "DataParallel" in two["dp"]["description"]
    one = {r["name"]: r for r in json.loads(gputui("strategies", "--devices", "cpu",
                                                   "--json").stdout)["strategies"]}
    assert one["dp"]["available"]
    assert not one["model_parallel"]["available"]
    assert one["model_parallel"]["reason"].startswith("strategy 'model_parallel' needs at least 2")


def test_bad_split_points_from_the_cli_exit_2_with_one_line():
    proc = gputui("run", "quickstart", "--strategy", "model_parallel",
                  "--set", "strategy.split_points=[0]")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "gputui: error: --set strategy.split_points=[0]: strategy.split_points[0] must be at "
        "least 1, got 0"]



@pytest.mark.slow
def test_model_parallel_pipelined_runs_end_to_end(tmp_path):
    from gputui.core.runstore import read_events

    proc = gputui("run", "quickstart", "--strategy", "model_parallel", "--epochs", "1",
                  "--set", "strategy.pipeline_chunks=4", "--set", "data.train_size=1024",
                  "--set", "data.test_size=256", "--runs-dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "finished" and summary["strategy"] == "model_parallel"
    assert summary["devices"] == ["cpu:0", "cpu:1"] and 0 <= summary["test_acc"] <= 1
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    events = read_events(run_dir)
    notes = [e.message for e in events if e.kind == "log"]
    assert summary["notes"] == notes  # the record's summary keeps them too
    assert any(n.startswith("model_parallel: lenet cut into 2 stages balanced by parameter "
                            "count, split points [2]") for n in notes), notes
    steps = [e for e in events if e.kind == "step"]
    assert steps and all(e.comm_share is not None and 0 <= e.comm_share <= 1 for e in steps)
    rows = steps[-1].per_device
    assert [d.device for d in rows] == ["cpu:0", "cpu:1"]
    assert all(d.samples == 256 and d.compute_s > 0 for d in rows)


@pytest.mark.slow
def test_dp_on_cpu_says_plainly_it_ran_without_replication(tmp_path):
    proc = gputui("run", "quickstart", "--strategy", "dp", "--epochs", "1",
                  "--set", "data.train_size=512", "--set", "data.test_size=128",
                  "--runs-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert ("DataParallel has no CPU mode: it ran without replication, the whole batch on one "
            "CPU device (cpu:0); cpu:1 stayed idle") in " ".join(proc.stdout.split())
    assert "status finished" in proc.stdout


def test_a_cuts_stages_name_the_kinds_of_blocks_they_hold():
    """A GPT's blocks are its embedding, its transformer blocks and its head: a stage's note
    says which (gpt-tiny on 2 stages: 'blocks 0-2' alone read as three of its four
    transformer blocks)."""
    from gputui.train.gpt import GPTShape, gpt
    from gputui.train.strategies.model_parallel import cut_blocks

    model = gpt(GPTShape(vocab_size=256, context=16, n_layer=4, n_head=2, n_embd=16))
    cut = cut_blocks(list(model.children()), 2, [3], "gpt", "pp", "stages")
    assert cut.bounds == [0, 3, 6]
    assert cut.units(0, 3) == "blocks 0-2 (Embed, Block x2)"
    assert cut.units(3, 6) == f"blocks 3-5 (Block x2, {type(model[5]).__name__})"
    assert cut.units(0, 1) == "block 0 (Embed)"
