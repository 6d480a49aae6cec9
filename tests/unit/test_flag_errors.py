"""A value given on the command line is blamed as such: a broken combination names the flag
(`--devices`, `--set optim.micro_batches=...`) that set the key, and the preset file only
when the preset holds every key the rule is about."""

from __future__ import annotations

import pytest

from gputui import cli
from gputui.core.presets import resolve_preset

QUICKSTART = resolve_preset("quickstart")


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,expected", [
    (["--devices", "cpu,cpu"], "--devices: 'cpu,cpu' lists CPU devices with commas, which are "
                               "for GPU indices; write cpu*2 for 2 CPU virtual devices"),
    (["--devices", "0,cpu"], "--devices: '0,cpu' mixes CPU virtual devices and GPUs; choose "
                             "either cpu*N or GPU indices"),
    (["--set", "devices.spec=cpu,cpu*3"], "--set devices.spec=cpu,cpu*3: 'cpu,cpu*3' lists CPU "
                                          "devices with commas"),
    (["--set", "run.precision=fp16"], "--set run.precision=fp16: run.precision = 'fp16' needs "
                                      "CUDA devices"),
    (["--set", "optim.micro_batches=1000"], "--set optim.micro_batches=1000: optim.batch_size "
                                            "(256) must give every one of the 2 devices"),
    (["--batch-size", "1"], "--batch-size: optim.batch_size (1) must give every one"),
    (["--strategy", "model_parallel", "--devices", "cpu"],
     "--strategy, --devices: strategy 'model_parallel' needs at least 2 devices"),
    (["--set", "dist.node_rank=3"], "--set dist.node_rank=3: dist.node_rank (3) must be below"),
    (["--set", "run.name=../x"], "--set run.name=../x: run.name '../x' looks like a path"),
])
def test_a_flags_error_names_the_flag_not_the_preset(capsys, args, expected):
    code, err = run_cli(capsys, "run", "quickstart", "--dry-run", *args)
    assert code == 2
    assert err.startswith(f"gputui: error: {expected}"), err
    assert str(QUICKSTART) not in err and err.count("\n") == 1


def test_a_presets_own_error_still_names_the_preset(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[devices]\nspec = "cpu,cpu"\n')
    code, err = run_cli(capsys, "run", str(bad), "--dry-run", "--epochs", "2")
    assert code == 2
    assert err == (f"gputui: error: {bad}: devices.spec: 'cpu,cpu' lists CPU devices with "
                   f"commas, which are for GPU indices; write cpu*2 for 2 CPU virtual devices\n")


def test_bench_comm_refuses_nccl_on_cpu_devices_before_spawning(capsys):
    """The backend rule of plan, as a ddp run has it: one line naming both flags, exit 2."""
    code, err = run_cli(capsys, "bench-comm", "--devices", "cpu*2", "--backend", "nccl")
    assert code == 2
    assert err == ("gputui: error: --backend nccl needs CUDA devices, --devices cpu*2 gives "
                   "CPU ones; use 'gloo' or 'auto'\n")
