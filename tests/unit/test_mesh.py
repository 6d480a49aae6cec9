"""The mesh before torch (``gputui.core.mesh``): every named strategy is a point of it, the
degrees of ``[parallel]`` resolve against the world, and the dimensions not built yet are
refused with their reason when the config is read."""

from __future__ import annotations

import pytest

from gputui.core.config import ConfigError, RunConfig, apply_overrides
from gputui.core.mesh import MeshShape, mesh_of, meshes


def cfg(**sets) -> RunConfig:
    return apply_overrides(RunConfig(), [("t", k, v) for k, v in sets.items()])


@pytest.mark.parametrize("name, world, expected, kind", [
    ("ddp", 4, MeshShape(dp_replicate=4, one_group="ddp"), "ddp"),
    ("fsdp", 4, MeshShape(dp_shard=4, one_group="fsdp"), "fsdp"),
    ("ddp", 1, MeshShape(one_group="ddp"), "ddp"),  # one rank: still DDP's program
    ("tp", 4, MeshShape(tp=4), "none"),
    ("pp", 2, MeshShape(pp=2), "none"),
    ("fsdp_tp", 8, MeshShape(dp_shard=4, tp=2), "fsdp"),
])
def test_each_named_strategy_is_a_point_of_the_mesh(name, world, expected, kind):
    shape = mesh_of(cfg(**{"strategy.name": name}), world)
    assert shape == expected and shape.world == world and shape.data_parallel == kind


def test_the_mesh_takes_its_degrees_and_the_rest_goes_to_dp_shard():
    c = cfg(**{"strategy.name": "mesh", "parallel.dp_replicate": 2, "parallel.tp": 2,
               "parallel.zero": 2, "parallel.ac": "full"})
    shape = mesh_of(c, 8)
    assert (shape.dp_replicate, shape.dp_shard, shape.tp, shape.pp) == (2, 2, 2, 1)
    assert shape.dp == 4 and shape.data_parallel == "fsdp"
    assert shape.describe() == "dp_replicate 2 x dp_shard 2 x tp 2"
    assert shape.levers() == "ZeRO-2, full activation checkpointing"


def test_zero1_is_ddp_with_a_sharded_optimizer_and_hsdp_is_fully_shard():
    zero1 = mesh_of(cfg(**{"strategy.name": "fsdp", "parallel.zero": 1}), 4)
    assert zero1.data_parallel == "ddp" and zero1.dp_shard == 4
    hsdp = mesh_of(cfg(**{"strategy.name": "mesh", "parallel.dp_replicate": 2}), 4)
    assert hsdp.data_parallel == "fsdp" and (hsdp.dp_replicate, hsdp.dp_shard) == (2, 2)


def test_every_mesh_of_a_world_multiplies_to_it():
    found = meshes(8)
    assert all(m.world == 8 for m in found) and len(found) == len(set(found))
    # 8 = 2^3 over 5 dimensions: C(3 + 4, 4) = 35 ways
    assert len(found) == 35 and found[0].tp == 1 and found[0].pp == 1 and found[0].cp == 1


def test_expert_parallelism_is_carved_from_the_data_parallel_ranks():
    """ep does not multiply the world: 4 ranks of ddp with ep 2 are 4 ranks, 2 ep groups."""
    from gputui.core.mesh import mesh_of

    shape = mesh_of(cfg(**{"strategy.name": "ddp", "parallel.ep": 2}), 4)
    assert (shape.world, shape.dp, shape.ep) == (4, 4, 2)
    assert shape.describe() == "dp_replicate 4 (ep 2)"
    mesh = mesh_of(cfg(**{"strategy.name": "mesh", "parallel.dp_replicate": 2,
                          "parallel.ep": 4}), 4)
    assert (mesh.world, mesh.ep, mesh.data_parallel) == (4, 4, "fsdp")
    from gputui.core.mesh import rank_label

    assert rank_label(shape, 3) == "dp 3 · ep 1"  # the app's device panel title


def test_strategies_lists_every_mesh_of_the_devices_with_why_not():
    """`gputui strategies --devices cpu*4 --json`: every mesh of 4 ranks; the default LeNet
    cannot take tensor parallelism (the reason says so), the GPT preset can."""
    import json
    import subprocess
    import sys

    def meshes(*flags):
        out = subprocess.run([sys.executable, "-m", "gputui", "strategies", "--devices", "cpu*4",
                              "--json", *flags], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)["meshes"]

    lenet = meshes()
    assert len(lenet) == 15 and all(m["degrees"]["pp"] * m["degrees"]["dp_replicate"]
                                    * m["degrees"]["dp_shard"] * m["degrees"]["cp"]
                                    * m["degrees"]["tp"] == 4 for m in lenet)
    no_tp = [m for m in lenet if m["degrees"]["tp"] > 1]
    assert no_tp and all(not m["available"] and "built-in GPT" in m["reason"] for m in no_tp)
    gpt = meshes("--preset", "gpt-tiny", "--set", "model.n_head=2")
    tp4 = next(m for m in gpt if m["degrees"]["tp"] == 4)
    assert "model.n_head = 2 does not split over 4" in tp4["reason"]
    hsdp = next(m for m in gpt if m["degrees"]["dp_replicate"] == 2 and m["degrees"]["tp"] == 1
                and m["degrees"]["pp"] == 1 and m["degrees"]["cp"] == 1)
    assert hsdp["available"] and hsdp["data_parallel"] == "fsdp"
    no_cp = [m for m in lenet if m["degrees"]["cp"] > 1]
    assert len(no_cp) == 5 and all("built-in GPT's sequences" in m["reason"] for m in no_cp)
    cp = [m for m in gpt if m["degrees"]["cp"] > 1 and m["available"]]
    assert {m["mesh"] for m in cp} >= {"cp 4", "dp_shard 2 x cp 2", "dp_replicate 2 x cp 2"}


def test_each_rank_knows_its_place_as_torch_lays_the_mesh_out():
    from gputui.core.mesh import coordinates, rank_label

    shape = MeshShape(pp=2, dp_replicate=2, dp_shard=2, tp=2)  # row-major, tp innermost
    assert coordinates(shape, 0) == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 0}
    assert coordinates(shape, 13) == {"pp": 1, "dp_replicate": 1, "dp_shard": 0, "tp": 1}
    assert rank_label(shape, 13) == "stage 1 · dp 2 (replica 1, shard 0) · tp 1"
    assert rank_label(MeshShape(dp_shard=4), 3) == "dp 3"
    assert rank_label(MeshShape(), 0) == ""


@pytest.mark.parametrize("command, sets, says", [
    (["predict", "gpt-tiny", "--devices", "2", "--strategies", "fsdp"], ["parallel.zero=2"],
     "parallel.zero = 2: predict's models do not cover this yet"),
    (["tune", "gpt-tiny", "--devices", "2"], ["parallel.ac=full"],
     "parallel.ac = 'full': tune's predictions do not cover this yet"),
    (["predict", "gpt-tiny", "--devices", "2", "--strategies", "fsdp"],
     ["strategy.schedule=zbv"], "strategy.schedule = 'zbv': predict's models"),
    (["predict", "gpt-tiny", "--devices", "2", "--strategies", "mesh"], [],
     "'mesh' has no prediction"),
    (["predict", "gpt-moe-tiny", "--devices", "2", "--strategies", "ddp"], ["parallel.ep=2"],
     "model.moe_experts = 4: predict's models do not cover this yet"),
])
def test_predict_and_tune_say_plainly_what_they_do_not_model(command, sets, says, tmp_path):
    """The mesh's levers that predict's formulas do not model are refused in one line, exit 2,
    before anything is measured (nothing is written)."""
    import subprocess
    import sys

    flags = [x for s in sets for x in ("--set", s)]
    out = subprocess.run([sys.executable, "-m", "gputui", *command, *flags],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert list(tmp_path.iterdir()) == []
