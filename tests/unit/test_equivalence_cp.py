"""Context parallelism (gputui.train.context_parallel): the zig-zag split, the plan's rules, the
choice of attention on CUDA (a fake at the boundary), and on 4 gloo ranks launched once
(cp_ranks.py): the ring's loss and gradients against the plain model's on one batch (cp 2 and
cp 4), its hops and bytes, and cp, cp x ddp, cp x fsdp (also with activation checkpointing)
and cp x tp trained as runs against single.

The tolerance, from the arithmetic: the ring computes the same softmax, its sums (the
denominator over the keys, the output over the values, then each parameter's gradient over
the tokens, now in cp parts added by the all-reduce) taken in another order. A reordered float32
sum moves by a few units of roundoff of its terms: rounding.RHO (16 u) of the gradient's
global norm is the bound the equivalence tests use for every such reordering
(tests/unit/rounding.py); the loss, a mean over the tokens summed in cp parts, by RHO of its
value. A real bug (a wrong mask, a lost block, a gradient not sent home) moves them by orders
of magnitude more (the mask test below).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cp_ranks
import pytest
import torch
from rounding import RHO
from strategy_harness import assert_params_close

from gputui.core.config import RunConfig, apply_overrides
from gputui.core.devices import cpu_devices
from gputui.core.mesh import MeshShape, cp_context_problem, coordinates, mesh_of, meshes
from gputui.train import context_parallel as ctx

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- the split, pure
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_zigzag_split_covers_the_sequence_and_balances_the_triangle(cp):
    context = 8 * cp
    parts = [ctx.zigzag_positions(context, cp, r) for r in range(cp)]
    assert sorted(torch.cat(parts).tolist()) == list(range(context))
    assert parts[0].tolist()[:4] == [0, 1, 2, 3]  # rank 0: the first chunk and the last
    assert parts[0].tolist()[-1] == context - 1
    # every rank's queries see the same number of keys under the causal mask
    work = {int((p + 1).sum()) for p in parts}
    assert len(work) == 1
    x = torch.arange(3 * context).view(3, context)
    assert torch.equal(ctx.unsplit([ctx.split(x, cp, r) for r in range(cp)]), x)
    assert ctx.zigzag_positions(7, 1, 0).tolist() == list(range(7))  # one rank: any context


def test_a_plain_split_would_not_balance():
    """Why the zig-zag: on contiguous quarters the causal triangle's work (the keys each
    query sees) grows rank by rank, towards 1:3:5:7 as the chunks grow."""
    cp = 4
    plain = [torch.arange(r * 8, r * 8 + 8) for r in range(cp)]
    assert [int((p + 1).sum()) for p in plain] == [36, 100, 164, 228]


def test_block_merge_is_the_whole_softmax_and_a_wrong_mask_is_not():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 8, 4, generator=g) for _ in range(3))
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    scale = 4 ** -0.5
    # the second half of the queries over the first half of the keys (all of it), then the
    # second half of the keys (causal): merged, the causal attention of the second half
    o1, l1 = ctx.block_attention(q[..., 4:, :], k[..., :4, :], v[..., :4, :], scale, False)
    o2, l2 = ctx.block_attention(q[..., 4:, :], k[..., 4:, :], v[..., 4:, :], scale, True)
    out, _ = ctx.merge(o1, l1, o2, l2)
    err = (out - whole[..., 4:, :]).abs().max().item()
    assert err <= RHO * whole.abs().max().item()
    wrong, _ = ctx.merge(o1, l1, *ctx.block_attention(q[..., 4:, :], k[..., 4:, :],
                                                       v[..., 4:, :], scale, False))
    assert (wrong - whole[..., 4:, :]).abs().max().item() > 1e4 * err


def test_the_attention_on_cuda_is_torchs_where_it_has_it(monkeypatch):
    """The boundary, faked: which context_parallel this torch has (present in 2.11 and 2.13;
    an older torch lacks it). The CPU always runs the ring: torch's drives GPU kernels."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert ctx.choose(cuda, available=object()) == "torch"
    assert ctx.choose(cuda, available=False) == "ring"
    assert ctx.choose(cpu, available=object()) == "ring"
    assert ctx.torch_context_parallel() is not None  # this torch (2.13) has it
    import torch.distributed.tensor.experimental as experimental

    monkeypatch.delattr(experimental, "context_parallel")
    assert ctx.torch_context_parallel() is None
    assert ctx.choose(cuda) == "ring"


# ---------------------------------------------------------------- the mesh and the plan
def cfg(**overrides) -> RunConfig:
    base = {"model.name": "gpt", "data.name": "pystdlib", "data.context": 32}
    return apply_overrides(RunConfig(), [("test", k, v) for k, v in {**base,
                                                                      **overrides}.items()])


def test_cp_is_a_degree_of_the_mesh_between_dp_shard_and_tp():
    shape = mesh_of(cfg(**{"strategy.name": "mesh", "parallel.cp": 2}), 4)
    assert (shape.dp_shard, shape.cp, shape.world) == (2, 2, 4)
    assert shape.describe() == "dp_shard 2 x cp 2" and shape.data_parallel == "fsdp"
    assert coordinates(shape, 3) == {"dp_shard": 1, "cp": 1}
    alone = mesh_of(cfg(**{"strategy.name": "cp"}), 4)
    assert alone.cp == 4 and alone.data_parallel == "ddp"  # the cp ranks average gradients
    assert MeshShape(dp_replicate=2, cp=2).data_parallel == "ddp"
    assert sum(1 for m in meshes(4) if m.cp > 1) == 5  # cp 2 or 4 beside the others


@pytest.mark.parametrize("overrides,devices,expected", [
    ({"strategy.name": "cp", "data.context": 36}, "cpu*4",
     "data.context = 36 does not split into 2 x parallel.cp = 8 equal chunks"),
    ({"strategy.name": "cp", "model.name": "mlp", "data.name": "synthetic"}, "cpu*2",
     "strategy 'cp' splits the built-in GPT's sequences over 2 context-parallel rank(s)"),
    ({"strategy.name": "mesh", "parallel.cp": 2, "parallel.pp": 2, "parallel.dp_shard": 1},
     "cpu*4", "parallel.cp with parallel.pp is not in gputui yet"),
    ({"strategy.name": "mesh", "parallel.cp": 2, "parallel.zero": 1}, "cpu*4",
     "parallel.zero = 1 (DDP with a sharded optimizer) is not combined with cp"),
    ({"strategy.name": "mesh", "parallel.cp": 3}, "cpu*4",
     "the mesh's pp x dp_replicate x cp x tp = 3 does not divide the 4 ranks"),
    ({"strategy.name": "ddp", "parallel.cp": 2}, "cpu*4",
     "parallel.cp sets a degree of strategy 'mesh'"),
])
def test_the_plan_says_why_cp_cannot_run(overrides, devices, expected):
    from gputui import plan

    c = cfg(**{"devices.spec": devices, **overrides})
    reason = plan.why_not(c, cpu_devices(int(devices.split("*")[1])))
    assert reason is not None and expected in reason, reason


def test_the_plan_takes_cp_with_ddp_fsdp_and_tp():
    from gputui import plan

    devs = cpu_devices(4)
    for extra in ({"strategy.name": "cp"},
                  {"strategy.name": "mesh", "parallel.cp": 2},
                  {"strategy.name": "mesh", "parallel.cp": 2, "parallel.dp_replicate": 2,
                   "parallel.dp_shard": 1},
                  {"strategy.name": "mesh", "parallel.cp": 2, "parallel.tp": 2,
                   "parallel.dp_shard": 1}):
        assert plan.why_not(cfg(**{"devices.spec": "cpu*4", **extra}), devs) is None, extra
    assert cp_context_problem(32, 4) is None and cp_context_problem(33, 1) is None


# ---------------------------------------------------------------- on 4 gloo ranks
@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp") / "ranks.pt"
    proc = subprocess.run([sys.executable, str(HERE / "cp_ranks.py"), str(out)],
                          capture_output=True, text=True, timeout=500, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(g.double()) for g in grads.values()])).item()


@pytest.mark.slow
@pytest.mark.parametrize("cp", ["cp2", "cp4"])
def test_the_rings_loss_and_gradients_equal_the_plain_models(ranks, cp):
    for rank in range(4):
        got = ranks[rank][cp]
        assert got["kind"] == "ring" and got["cp"] == int(cp[2:])
        assert abs(got["loss"] - got["ref_loss"]) <= RHO * abs(got["ref_loss"])
        bound = RHO * _norm(got["ref_grads"])
        for name, g in got["grads"].items():
            diff = (g.double() - got["ref_grads"][name].double()).abs().max().item()
            assert diff <= bound, f"{name}: {diff:.3g} > {bound:.3g}"
        assert got["eval_equal"]  # outside a step the layers run as without cp


@pytest.mark.slow
def test_each_hop_is_a_named_collective_with_its_bytes(ranks):
    """Per layer and step: cp - 1 key/value hops in forward, cp - 1 in backward and cp hops of
    their gradients (the last one home); each hop carries k and v (fp32)."""
    shape, cp = cp_ranks.SHAPE, 4
    hops = (3 * cp - 2) * shape["n_layer"]
    block = 2 * cp_ranks.BATCH * shape["context"] // cp * shape["n_embd"] * 4
    for rank in range(4):
        got = ranks[rank]["cp4"]
        # and on the CPU the waits after each hop's compute (one per hop at most)
        assert got["kinds"][ctx.KIND] == hops and set(got["kinds"]) <= {ctx.KIND, ctx.WAIT_KIND}
        assert got["kinds"].get(ctx.WAIT_KIND, 0) <= hops
        assert got["stats"]["hops"] == hops and got["comm_bytes"] == hops * block
        assert got["stats"]["attention_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(cp_ranks.SCENARIOS))
def test_the_strategy_equals_single(ranks, name):
    """cp over 4 ranks, cp 2 x ddp 2, cp 2 x fsdp 2 (and with full checkpointing, whose
    recomputation runs the ring again in backward) and cp 2 x tp 2 (the ring over each rank's
    heads) train gpt (AdamW, warm-up, cosine,
    clipping) to single's parameters within the rounding bound, with its losses and
    validation score; the checkpoint restores them (one scenario per checkpoint layout:
    cp_ranks.RESUMED)."""
    import tp_ranks
    from rounding import assert_equal_within_rounding

    _, size, extra = cp_ranks.SCENARIOS[name]
    single, losses, score = tp_ranks.single_reference(size, extra)
    for rank in range(4):
        got = ranks[rank]["strategies"][name]
        assert got["batch_size"] == size
        assert_equal_within_rounding(got["params"], single)
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
        assert got["score"] == pytest.approx(score, rel=1e-5)
        if name in cp_ranks.RESUMED:  # its checkpoint, restored (the others: its layout's)
            assert_params_close(got["resumed_params"], got["params"])
    rows = ranks[0]["strategies"][name]["memory"]
    assert len(rows) == 4 and all(r["params"] > 0 for r in rows)
