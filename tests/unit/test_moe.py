"""The mixture-of-experts GPT in one process (gputui.train.moe): the layer computes what a
token-by-token loop over its chosen experts computes, drops exactly the assignments past the
global capacity queue, its load-balancing loss is Switch's, its FLOPs count the active
parameters; and a real `gputui run` with parallel.ep on cpu*2 records and prints the
routing, the all-to-alls' bytes, the experts' memory per rank and the active parameters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gputui.core.moe_text import moe_lines, rank_line
from gputui.train.moe import MoE, capacity, kept_counts


def test_the_capacity_queue_is_slot_major_then_rank_order():
    # 2 ranks, top-2, 2 experts: [rank, slot, expert] assignments before the capacity
    counts = torch.tensor([[[3, 1], [1, 3]], [[2, 2], [2, 2]]])
    kept = kept_counts(counts, 4)
    # every first choice queues before any second; within a slot rank 0 before rank 1
    assert kept.tolist() == [[[3, 1], [0, 1]], [[1, 2], [0, 0]]]
    assert kept.sum((0, 1)).tolist() == [4, 4]  # each expert full, no more
    assert capacity(1.25, 64, 2, 4) == 40 and capacity(0.0, 64, 2, 4) == 128  # 0: no limit


def naive(layer: MoE, x: torch.Tensor, cap: int | None) -> torch.Tensor:
    """Token by token: each assignment in the capacity queue's order, through its expert."""
    tokens = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(layer.router(tokens), -1)
    gate, expert = probs.topk(layer.top_k, -1)
    if layer.top_k > 1:
        gate = gate / gate.sum(-1, keepdim=True)
    out = torch.zeros_like(tokens)
    taken = [0] * layer.n_experts
    ex = layer.experts
    for s in range(layer.top_k):  # slot-major
        for i in range(len(tokens)):
            e = int(expert[i, s])
            if cap is not None and taken[e] >= cap:
                continue
            taken[e] += 1
            h = torch.nn.functional.gelu(tokens[i] @ ex.fc[e] + ex.fc_bias[e])
            out[i] += gate[i, s] * (h @ ex.proj[e] + ex.proj_bias[e])
    return out.view_as(x)


@pytest.mark.parametrize("factor,top_k", [(0.0, 2), (0.5, 2), (1.0, 1)])
def test_the_layer_is_its_token_by_token_loop(factor, top_k):
    torch.manual_seed(0)
    layer = MoE(8, 4, top_k, factor)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        got = layer(x)
        cap = capacity(factor, 12, top_k, 4) if factor else None
        torch.testing.assert_close(got, naive(layer, x, cap), rtol=1e-5, atol=1e-6)
    stats = layer.stats
    assert int(stats.routed.sum()) == 12 * top_k
    dropped = int(stats.routed.sum() - stats.kept.sum())
    over = sum(max(0, int(r) - cap) for r in stats.routed) if cap is not None else 0
    assert dropped == over and (dropped > 0) == (factor == 0.5 or over > 0)
    assert factor != 0.5 or dropped > 0  # the small capacity did drop


def test_the_load_balancing_loss_is_switchs():
    layer = MoE(8, 4, 2, 0.0)
    torch.nn.init.zeros_(layer.router.weight)  # every probability 1/4, ties to experts 0, 1
    layer(torch.randn(1, 5, 8))
    # E x sum_e f_e P_e = 4 x (1/2 x 1/4 + 1/2 x 1/4): balanced or not, 1 at uniform P
    assert layer.aux is not None and layer.aux.item() == pytest.approx(1.0)
    torch.manual_seed(1)
    torch.nn.init.normal_(layer.router.weight, std=1.0)
    x = torch.randn(1, 64, 8)
    layer(x)
    probs = torch.softmax(layer.router(x[0]), -1)
    share = torch.nn.functional.one_hot(probs.topk(2, -1).indices, 4).sum((0, 1)) / 128
    assert layer.aux.item() == pytest.approx(4 * (share * probs.mean(0)).sum().item(), rel=1e-5)


def test_flops_count_the_active_parameters():
    from gputui.train.flops import count_step_flops, moe_params
    from gputui.train.gpt import GPTShape, gpt

    def shape(**kw):
        return lambda: gpt(GPTShape(64, 16, 2, 4, 32, **kw))

    dense = count_step_flops(shape(), (8, 16), 64, task="lm")
    top1 = count_step_flops(shape(moe_experts=4), (8, 16), 64, task="lm")
    top2 = count_step_flops(shape(moe_experts=4, moe_top_k=2), (8, 16), 64, task="lm")
    assert dense < top1 < 1.02 * dense  # one expert a token: a dense MLP, plus the router
    mlp = 6 * 2 * 8 * 16 * (2 * 32 * 128)  # the MLPs' matmuls: 6 x params x tokens
    assert top2 - top1 == pytest.approx(mlp, rel=0.05)
    total, active = moe_params(shape(moe_experts=4, moe_top_k=2), 2)
    experts = 2 * 4 * (32 * 128 + 128 + 128 * 32 + 32)
    assert total - active == experts // 2


def test_the_routing_in_words():
    moe = {"routed": [110, 162, 146, 94], "kept": [100, 128, 128, 94], "dropped": 62,
           "ep": 2, "experts": 4, "top_k": 2}
    assert moe_lines(moe) == [
        "moe 4 experts top-2, ep 2: tokens/expert 110 162 146 94 (max/mean 1.27)",
        "kept tokens per ep rank 228 222 (max/mean 1.01) · dropped 62 of 512 assignments "
        "(12.1%)"]
    assert rank_line(moe, 1) == "experts 2-3: 222 tokens kept (0.99x mean)"
    assert moe_lines(None) == [] and rank_line({**moe, "ep": 1}, 0) is None


@pytest.mark.slow
def test_a_run_with_ep_on_two_ranks_equals_single_and_shows_its_routing(tmp_path):
    """`gputui run` on cpu*2, ep 2 under ddp, with a capacity that drops (the cpu*2 launch of
    the equivalence tests: test_equivalence_ep.py launches 4 ranks): its traced losses and
    parameters (debug.trace_steps) are single's within float32 rounding's bound, and the
    record and the printer show the routing, the all-to-alls' bytes, the experts per rank and
    the active parameters."""
    import os

    import ep_ranks
    from rounding import assert_equal_within_rounding
    from strategy_harness import make_config, run_steps

    from gputui.runs.verify_trace import read_trace

    steps, sets = 3, {**ep_ranks.MOE, **ep_ranks.DROPS, "data.train_size": 320,
                      "data.test_size": 64, "run.log_every": 1}
    cfg = make_config("ddp", "cpu*2", "gpt", ep_ranks.BATCH, **sets, **{
        "parallel.ep": 2, "debug.trace_steps": steps, "run.checkpoint": False})
    preset = tmp_path / "moe.toml"
    preset.write_text(cfg.to_toml())
    env = {**os.environ, "GPUTUI_RUNS_DIR": str(tmp_path / "runs"),
           "GPUTUI_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "gputui", "run", str(preset)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    # equal to single on the same batches (the trace's init and every step's parameters)
    single, losses = run_steps(make_config("single", "cpu", "gpt", ep_ranks.BATCH, **sets),
                               steps)
    trace = read_trace(run)
    assert trace.losses == pytest.approx(losses, rel=1e-5)
    assert trace.params is not None
    assert_equal_within_rounding({n: torch.from_numpy(v) for n, v in
                                  zip(trace.names, trace.params[-1], strict=True)}, single)
    routing = single.moe_stats()  # single's since its first step: the run's three steps
    out = proc.stdout
    assert "moe 4 experts top-2, ep 2: tokens/expert" in out
    assert "kept tokens per ep rank" in out and "ep dispatch" in out
    assert "expert parallelism: 4 experts a layer over groups of 2" in out
    assert "active parameters (of" in out
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    moe = [e["moe"] for e in events if e["type"] == "step"]
    assert len(moe) == steps
    assert [sum(c) for c in zip(*(m["routed"] for m in moe), strict=True)] == routing["routed"]
    assert sum(m["dropped"] for m in moe) == routing["dropped"] > 0  # single's drops
    for m in moe:  # each rank's tokens per expert, which add up to the routing
        assert len(m["sent"]) == 2 and torch.tensor(m["sent"]).sum(0).tolist() == m["routed"]
        assert sum(m["sent"][0]) == sum(m["sent"][1]) == 8 * 32 * 2 * 2  # 8 sequences a rank
    rows = [r for e in events if e["type"] == "step" for r in e["per_device"]
            if r.get("collective_bytes")]
    assert rows and all(r["collective_bytes"]["ep dispatch"] > 0 for r in rows)
    assert all({"ep dispatch", "ep combine"} <= set(r["collectives"]) for r in rows)
    (flops,) = [e for e in events if e["type"] == "flops"]
    assert 0 < flops["params_active"] < flops["params_total"]
    memory = [e for e in events if e["type"] == "memory"][0]
    whole = sum(p.numel() * 4 for n, p in single.primary_model().named_parameters()
                if ".experts." in n)
    assert [row["experts"] for row in memory["per_device"]] == [whole // 2] * 2
