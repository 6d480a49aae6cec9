"""The cross-field rules (``gputui.plan``) ask neither the hardware nor the disk, and a run's
devices are resolved once: per run on the command line, per point in a sweep."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gputui.core.config import ConfigError, RunConfig, apply_overrides
from gputui.core.devices import cpu_devices
from gputui.plan import check_files, validate

CPU1, CPU2 = [["cpu", 0]], [["cpu", 0], ["cpu", 1]]
CUDA2 = [["cuda", 0, "NVIDIA H100"], ["cuda", 1, "NVIDIA H100"]]
CPU4 = [["cpu", i] for i in range(4)]
GPT = {"model.name": "gpt", "data.name": "pystdlib"}

# (overrides, devices, what the refusal says, or None for a config that passes): every rule
CASES = [
    ({"dist.node_rank": 1}, CPU1, "t: dist.node_rank (1) must be below dist.nnodes (1)"),
    ({"strategy.name": "ddp", "dist.nnodes": 2}, CPU1, "dist.nnodes > 1 needs dist.rdzv_endpoint"),
    ({"strategy.name": "nope"}, CPU1, "strategy.name must be one of single, scratch"),
    ({"strategy.name": "model_parallel"}, CPU1, "needs at least 2 devices"),
    ({"devices.spec": "cpu*2"}, CPU2, "strategy 'single' uses 1 device"),
    ({"strategy.name": "scratch", "dist.nnodes": 2, "dist.rdzv_endpoint": "h:1"}, CPU2,
     "needs a multi-process strategy (ddp or fsdp), not 'scratch'"),
    ({"strategy.name": "scratch", "optim.batch_size": 3, "optim.micro_batches": 2}, CPU2,
     "must give every one of the 2 devices at least one example"),
    ({"strategy.split_weights": [1]}, CPU1, "applies to scratch and ddp, not 'single'"),
    ({"strategy.name": "ddp", "strategy.backend": "nccl"}, CPU2, "'nccl' needs CUDA devices"),
    ({"strategy.name": "ddp", "optim.batch_size": 1}, CPU2, "of the 2 ranks at least one"),
    ({"strategy.name": "model_parallel", "model.name": "mlp"}, [["cpu", i] for i in range(4)],
     "cuts mlp into at most 3 stages"),
    ({"strategy.name": "model_parallel", "strategy.split_points": [9]}, CPU2,
     "strategy.split_points must lie between 1 and 3"),
    ({"strategy.name": "model_parallel", "strategy.pipeline_chunks": 1000}, CPU2,
     "strategy.pipeline_chunks (1000) is more than"),
    ({"optim.batch_size": 1, "optim.micro_batches": 2}, CPU1, "is smaller than optim.micro_batches"),
    ({"debug.slow_rank": 0}, CPU1,
     "debug.slow_rank slows a rank of ddp, fsdp, tp, fsdp_tp, cp or mesh, not single"),
    ({"strategy.name": "ddp", "debug.slow_rank": 2}, CPU2,
     "debug.slow_rank (2) is not a rank of this run: it has 2"),
    ({"strategy.name": "fsdp", "debug.slow_rank": 1, "debug.slow_backward_ms": 50.0}, CPU2, None),
    ({"strategy.name": "pp"}, CPU1, "strategy 'pp' needs at least 2 devices"),
    ({"strategy.name": "pp", "model.name": "mlp"}, [["cpu", i] for i in range(4)],
     "strategy 'pp' cuts mlp into at most 3 stages (one per block)"),
    ({"strategy.name": "pp", "model.name": "gpt", "model.n_layer": 2, "data.name": "pystdlib"},
     [["cpu", i] for i in range(5)], "strategy 'pp' cuts gpt into at most 4 stages"),
    ({"strategy.name": "pp", "model.name": "gpt", "data.name": "pystdlib",
      "strategy.pipeline_chunks": 2}, CPU2, None),
    ({"strategy.name": "pp", "model.name": "gpt", "data.name": "pystdlib"}, CPU2,
     "strategy.schedule = '1f1b' needs strategy.pipeline_chunks of at least the 2 stages"),
    ({"strategy.name": "pp", "optim.batch_size": 30, "strategy.pipeline_chunks": 4}, CPU2,
     "optim.batch_size (30) is not divisible by 4"),
    ({"strategy.name": "pp", "devices.spec": "0,1", "run.precision": "fp16"}, CUDA2,
     "strategy 'pp' does not apply fp16's grad scaler"),
    ({"strategy.name": "pp", "strategy.schedule": "1f1b", "strategy.pipeline_chunks": 4}, CPU2,
     None),
    ({"strategy.name": "scratch", "strategy.split_weights": [1]}, CPU2,
     "strategy.split_weights has 1 entries for 2 devices"),
    ({"run.precision": "fp16"}, CPU1, "run.precision = 'fp16' needs CUDA devices"),
    # the mesh: its degrees multiply to the ranks, each lever where it applies
    ({"strategy.name": "mesh", **GPT, "parallel.dp_replicate": 2, "parallel.dp_shard": 2,
      "parallel.tp": 2}, CPU4, "the mesh's degrees (pp 1 x dp_replicate 2 x dp_shard 2 x tp 2) "
                               "multiply to 8, not the 4 ranks"),
    ({"strategy.name": "mesh", **GPT, "parallel.tp": 3}, CPU4,
     "the mesh's pp x dp_replicate x tp = 3 does not divide the 4 ranks"),
    ({"strategy.name": "mesh", **GPT, "parallel.dp_replicate": 2}, CPU4, None),  # HSDP 2 x 2
    ({"strategy.name": "mesh", **GPT, "parallel.dp_replicate": 2, "parallel.dp_shard": 1,
      "parallel.tp": 2}, CPU4, None),
    ({"strategy.name": "mesh", "parallel.tp": 2}, CPU4, "shards the built-in GPT's attention"),
    ({"strategy.name": "mesh", **GPT, "model.n_head": 2, "parallel.tp": 4}, CPU4,
     "model.n_head = 2 does not split over 4 tensor-parallel ranks"),
    ({"strategy.name": "ddp", "parallel.tp": 2}, CPU2,
     "parallel.tp sets a degree of strategy 'mesh', and 'ddp' is its own point of the mesh"),
    ({"parallel.dp_shard": 2}, CPU1, "parallel.dp_shard sets a degree of strategy 'mesh', "
                                     "and 'single': set strategy.name = 'mesh'"),
    ({"strategy.name": "fsdp", "parallel.zero": 2}, CPU1,
     "one rank has nothing to shard; use at least 2 devices"),
    ({"strategy.name": "mesh", **GPT, "parallel.pp": 2, "strategy.pipeline_chunks": 2,
      "debug.slow_rank": 1}, CPU4, "debug.slow_rank slows a rank's backward outside a pipeline"),
    ({"strategy.name": "fsdp_tp", **GPT, "optim.batch_size": 2}, CPU4, None),  # 2 dp groups

    ({"strategy.name": "ddp", "parallel.zero": 2}, CPU2,
     "parallel.zero = 2 shards over the dp_shard dimension, and strategy 'ddp' has none"),
    ({"strategy.name": "fsdp", "parallel.zero": 1}, CPU2, None),
    ({"strategy.name": "fsdp_tp", **GPT, "parallel.zero": 1}, CPU4,
     "parallel.zero = 1 (DDP with a sharded optimizer) does not take tensor parallelism"),
    ({"strategy.name": "ddp", "parallel.ac": "full"}, CPU2,
     "parallel.ac checkpoints each transformer block, and model.name = 'lenet' has none"),
    ({"strategy.name": "scratch", **GPT, "parallel.ac": "full"}, CPU2,
     "parallel.ac applies to single and the mesh strategies"),
    ({"strategy.name": "mesh", **GPT, "parallel.pp": 2, "strategy.pipeline_chunks": 2}, CPU4,
     None),  # pp 2 x dp_shard 2
    ({"strategy.name": "mesh", **GPT, "parallel.pp": 2, "strategy.pipeline_chunks": 4,
      "strategy.schedule": "zbv"}, CPU4, "strategy.schedule = 'zbv' puts the first and last"),
    ({"strategy.name": "pp", **GPT, "strategy.pipeline_chunks": 3, "optim.batch_size": 24,
      "strategy.schedule": "interleaved_1f1b"}, CPU2,
     "strategy.pipeline_chunks (3) must be a multiple of 2"),
    ({"strategy.name": "pp", **GPT, "model.n_layer": 2, "strategy.pipeline_chunks": 4,
      "strategy.schedule": "looped_bfs", "strategy.stages_per_rank": 3}, CPU2,
     "the pipeline asks for 2 ranks x 3 stages per rank = 6 stages"),
    ({"strategy.name": "mesh", **GPT, "parallel.pp": 2, "parallel.dp_replicate": 2,
      "optim.batch_size": 6, "strategy.pipeline_chunks": 2}, CPU4,
     "each of the 2 data-parallel slices into optim.micro_batches x strategy.pipeline_chunks"),
    # the mixture of experts and expert parallelism (carved from the data-parallel ranks)
    ({"strategy.name": "ddp", **GPT, "parallel.ep": 2}, CPU2,
     "parallel.ep = 2 shards the experts of a mixture of experts; set model.moe_experts"),
    ({"model.moe_experts": 4}, CPU1, "model.moe_experts replaces the built-in GPT's MLPs"),
    ({**GPT, "model.moe_experts": 2, "model.moe_top_k": 3}, CPU1,
     "model.moe_top_k (3) routes each token to more experts than model.moe_experts (2)"),
    ({"strategy.name": "ddp", **GPT, "model.moe_experts": 6, "parallel.ep": 4}, CPU4,
     "model.moe_experts (6) does not split over parallel.ep = 4 ranks"),
    ({"strategy.name": "ddp", **GPT, "model.moe_experts": 8, "parallel.ep": 4}, CPU2,
     "parallel.ep = 4 is carved from the data-parallel ranks, and strategy 'ddp' has 2"),
    ({"strategy.name": "tp", **GPT, "model.moe_experts": 4}, CPU2,
     "the mixture-of-experts GPT trains with single, ddp, fsdp, mesh here, not 'tp'"),
    ({"strategy.name": "mesh", **GPT, "model.moe_experts": 4, "parallel.tp": 2}, CPU4,
     "does not take tensor, pipeline or context parallelism here (mesh dp_shard 2 x tp 2)"),
    ({"strategy.name": "mesh", **GPT, "model.moe_experts": 4, "parallel.cp": 2}, CPU2,
     "does not take tensor, pipeline or context parallelism here (mesh cp 2)"),
    ({"strategy.name": "fsdp", **GPT, "model.moe_experts": 4, "parallel.ep": 2,
      "parallel.zero": 1}, CPU2, "parallel.zero = 1's sharded optimizer would broadcast"),
    ({**GPT, "model.moe_experts": 4, "run.compile": "default"}, CPU1,
     "run.compile does not take the mixture of experts here"),
    ({"strategy.name": "ddp", **GPT, "model.moe_experts": 4, "parallel.ep": 2}, CPU4, None),
    ({"strategy.name": "mesh", **GPT, "model.moe_experts": 4, "parallel.dp_replicate": 2,
      "parallel.ep": 4}, CPU4, None),  # HSDP 2 x 2, one ep group over both
    ({**GPT, "model.moe_experts": 4}, CPU1, None),
    # GPUs, and files named but not read: validate passes them without asking anyone
    ({"strategy.name": "ddp", "devices.spec": "0,1", "run.precision": "fp16"}, CUDA2, None),
    ({"model.factory": "{py}:build", "data.factory": "mypkg.data:load", "data.name": "mnist",
      "run.resume_from": "{tmp}/no-run", "data.root": "{tmp}"}, CPU1, None),
]

# a field's own rules are checked where the field is read, before any cross-field rule
FIELD_CASES = [
    ({"dist.rdzv_endpoint": "h"}, "dist.rdzv_endpoint must be HOST:PORT"),
    # a host torch's launcher would fail on, after the run started
    ({"dist.rdzv_endpoint": "my host;rm -rf x:29400"},
     "dist.rdzv_endpoint's host must be a host name or address"),
    ({"dist.rdzv_endpoint": "a..b:29400"}, "dist.rdzv_endpoint's host must be"),
    ({"strategy.split_weights": [1, -1]}, "strategy.split_weights[1] must be greater than 0.0, got -1.0"),
    ({"run.name": "../x"}, "run.name '../x' looks like a path"),
]


@pytest.mark.parametrize("sets,expected", FIELD_CASES)
def test_a_fields_own_rule_is_checked_with_the_field(sets, expected):
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), [("t", k, v) for k, v in sets.items()])
    assert str(err.value).startswith("t: ") and expected in str(err.value)


@pytest.mark.parametrize("endpoint", ["10.0.0.1:29400", "node-a.example.com:29400",
                                      "node_a:1", "[::1]:29400", "[fe80::1%eth0]:29400",
                                      "localhost.:29400"])
def test_a_rendezvous_host_name_or_address_is_accepted(endpoint):
    cfg = apply_overrides(RunConfig(), [("t", "dist.rdzv_endpoint", endpoint)])
    assert cfg.dist.rdzv_endpoint == endpoint


def test_why_not_says_what_the_strategy_picker_shows():
    from gputui.plan import why_not

    base = apply_overrides(RunConfig(), [("t", "optim.batch_size", 3),
                                         ("t", "optim.micro_batches", 2)])
    # the batch rule per device is the strategy's; the rule for the one process is not
    assert "every one of the 2 devices" in why_not(base.replace(strategy={"name": "scratch"}),
                                                   cpu_devices(2))
    assert why_not(base, cpu_devices(1)) is None
    assert why_not(base.replace(optim={"batch_size": 1}), cpu_devices(1)) is None
    with pytest.raises(ConfigError, match="is smaller than optim.micro_batches"):
        validate(base.replace(optim={"batch_size": 1}), cpu_devices(1), "t")


PROBE = r"""
import json, os, sys
sys.modules["pynvml"] = None  # NVML, and discovery, cannot even be imported
sys.modules["gputui.hw.nvml"] = sys.modules["gputui.hw.discovery"] = None
from gputui import plan
from gputui.core.config import ConfigError, RunConfig, apply_overrides
from gputui.core.devices import Device

cases = [(apply_overrides(RunConfig(), [("t", k, v) for k, v in sets.items()]),
          [Device(*d) for d in devices]) for sets, devices in json.loads(sys.argv[1])]
touched = []

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir"):
        touched.append(f"{event} {args[0]!r}")
        raise PermissionError(event)

def stat(path, *a, **k):
    touched.append(f"os.stat {path!r}")
    raise PermissionError("stat")

sys.addaudithook(hook)
os.stat = os.lstat = stat  # pathlib's is_file/is_dir and os.path go through these
out = []
for cfg, devices in cases:
    try:
        plan.validate(cfg, devices, "t")
        out.append(None)
    except ConfigError as exc:
        out.append(str(exc))
print(json.dumps({"messages": out, "touched": touched}))
"""


def _cases(tmp_path: Path) -> list:
    (tmp_path / "nets.py").write_text("def build():\n    pass\n")
    fill = {"{py}": str(tmp_path / "nets.py"), "{tmp}": str(tmp_path)}

    def sub(v):
        for k, x in fill.items():
            v = v.replace(k, x) if isinstance(v, str) else v
        return v
    return [({k: sub(v) for k, v in sets.items()}, devices, expected)
            for sets, devices, expected in CASES]


def test_validate_reads_no_file_and_asks_no_hardware(tmp_path):
    cases = _cases(tmp_path)
    arg = json.dumps([[sets, devices] for sets, devices, _ in cases])
    out = subprocess.run([sys.executable, "-c", PROBE, arg], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["touched"] == []
    for (sets, _, expected), message in zip(cases, got["messages"]):
        if expected is None:
            assert message is None, (sets, message)
        else:
            assert message is not None and expected in message, (sets, message)
            assert message.startswith("t: ") and "\n" not in message


def test_the_files_are_checked_apart_and_blamed_on_their_flag(tmp_path):
    sets = _cases(tmp_path)[-1][0]
    cfg = apply_overrides(RunConfig(), [("--set", k, v) for k, v in sets.items()])
    validate(cfg, cpu_devices(1), "p.toml")  # the rules hold; the disk is another matter
    with pytest.raises(ConfigError, match=r"^p.toml: data.factory = 'mypkg.data:load': no "
                                          r"module named 'mypkg'"):
        check_files(cfg, "p.toml")
    found = cfg.replace(data={"factory": ""})
    with pytest.raises(ConfigError) as err:
        check_files(found, "p.toml", {"run.resume_from": "--set run.resume_from=x"})
    assert str(err.value) == (f"--set run.resume_from=x: run.resume_from: no checkpoint at "
                              f"{tmp_path / 'no-run'}; give a run folder holding checkpoint.pt "
                              f"(see `gputui resume`)")
    (tmp_path / "no-run").mkdir()
    (tmp_path / "no-run" / "checkpoint.pt").write_bytes(b"")  # a file, but not a checkpoint
    with pytest.raises(ConfigError, match="is not a whole checkpoint"):
        check_files(found, "p.toml")
    with zipfile.ZipFile(tmp_path / "no-run" / "checkpoint.pt", "w") as archive:  # as torch's
        archive.writestr("checkpoint/data.pkl", pickle.dumps(
            {"format": 1, "position": {}, "state": {}, "rng": {}}, protocol=2))
    check_files(found, "p.toml")


def discoveries(fake) -> int:
    """How many times GPUs were discovered: each discovery lists every GPU's processes."""
    return fake.calls.count("nvmlDeviceGetComputeRunningProcesses") // len(fake.gpus)


def test_a_run_discovers_its_gpus_once(fake_gpus, tmp_path, capsys):
    from gputui import cli

    fake = fake_gpus(2)
    fake.gpus[1].processes.append((4242, 2 * 1024**3))  # someone else's job on GPU 1
    preset = tmp_path / "p.toml"
    preset.write_text('[devices]\nspec = "0,1"\n[strategy]\nname = "scratch"\n')
    # the config checked, the devices resolved, busy GPUs found: one discovery for all three
    assert cli.main(["run", str(preset), "--exclusive", "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("gputui: error: --exclusive: cuda:1 (NVIDIA H100 "
                                              "80GB HBM3) is busy, used by 1 other process(es): "
                                              "pid 4242")
    assert discoveries(fake) == 1


def test_a_sweep_discovers_once_per_point_at_most(fake_gpus, tmp_path):
    """Two points on a one-GPU machine asking for GPUs 0 and 1: each falls back to two CPU
    virtual devices; scratch runs there (a real run), single cannot and is skipped."""
    from gputui.core.events import LogLine, RunStarted
    from gputui.core.runstore import read_events
    from gputui.runs.sweep.runner import Sweep
    from gputui.runs import warm

    fake = fake_gpus(1)
    preset = tmp_path / "p.toml"
    preset.write_text('[run]\nepochs = 1\nlog_every = 4\n[data]\ntrain_size = 256\n'
                      'test_size = 64\n[optim]\nbatch_size = 64\n[devices]\nspec = "0,1"\n'
                      'fallback = "cpu"\n[telemetry]\nenabled = false\n')
    sweep = Sweep.new(str(preset), [], ["0,1"], ["scratch", "single"], False, tmp_path / "runs",
                      [], "cpu")
    try:
        assert sweep.run() == "finished"
    finally:
        warm.close_all()
    ran, skipped = sweep.manifest.points
    assert (ran.status, skipped.status) == ("finished", "skipped"), ran.reason
    assert "strategy 'single' uses 1 device" in skipped.reason
    assert discoveries(fake) <= len(sweep.manifest.points)
    # the run got the devices, and the fallback's note, resolved for its point
    events = read_events(tmp_path / "runs" / ran.run_id)
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    assert [d["name"] for d in started.devices] == ["cpu:0", "cpu:1"]
    assert any(isinstance(e, LogLine) and e.message.startswith(
        "devices.spec '0,1' cannot be met (this machine has 1 GPU(s))") for e in events)
