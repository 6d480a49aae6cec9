"""The mixture-of-experts GPT in one process (gputui.train.moe): the layer computes what a
token-by-token loop over its chosen experts computes, drops exactly the assignments past the
global capacity queue, its load-balancing loss is Switch's, its FLOPs count the active
parameters; and a real `gputui run` with parallel.ep on cpu*2 records and prints the
routing, the all-to-alls' bytes, the experts' memory per rank and the active parameters."""

from __future__ import annotations

import json
import math
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
def test_a_run_with_ep_shows_its_routing_and_costs(tmp_path):
    """`gputui run` on cpu*2, ep 2 under ddp: the record and the printer."""
    env = {"GPUTUI_RUNS_DIR": str(tmp_path / "runs"), "GPUTUI_CACHE_DIR": str(tmp_path / "c")}
    import os

    argv = [sys.executable, "-m", "gputui", "run", "quickstart", "--strategy", "ddp",
            "--devices", "cpu*2", "--set", "model.name=gpt", "--set", "data.name=pystdlib",
            "--set", "data.context=16", "--set", "data.train_size=64",
            "--set", "data.test_size=16", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
            "--set", "model.n_head=2", "--set", "model.moe_experts=4",
            "--set", "model.moe_top_k=2", "--set", "parallel.ep=2", "--set", "optim.batch_size=16",
            "--set", "run.log_every=2", "--set", "run.epochs=1", "--set", "optim.lr=0.01"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "moe 4 experts top-2, ep 2: tokens/expert" in out
    assert "kept tokens per ep rank" in out and "ep dispatch" in out
    assert "expert parallelism: 4 experts a layer over groups of 2" in out
    (run,) = (tmp_path / "runs").iterdir()
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["type"] == "step"]
    assert steps and all(sum(e["moe"]["routed"]) == 2 * 16 * 16 * 2 for e in steps)
    for e in steps:  # each rank's tokens per expert, which add up to the routing
        sent = e["moe"]["sent"]
        assert len(sent) == 2 and torch.tensor(sent).sum(0).tolist() == e["moe"]["routed"]
        assert sum(sent[0]) == sum(sent[1]) == 2 * 8 * 16 * 2  # 8 sequences a rank
    timed = [r for e in steps for r in e["per_device"] if r.get("collective_bytes")]
    assert timed and all(r["collective_bytes"]["ep dispatch"] > 0 for r in timed)
    assert all({"ep dispatch", "ep combine"} <= set(r["collectives"]) for r in timed)
    (flops,) = [e for e in events if e["type"] == "flops"]
    assert 0 < flops["params_active"] < flops["params_total"]
    memory = [e for e in events if e["type"] == "memory"][0]
    per_rank = [row["experts"] for row in memory["per_device"]]
    assert len(per_rank) == 2 and per_rank[0] == per_rank[1]
    whole = 4 * (16 * 64 + 64 + 64 * 16 + 16) * 4  # bytes of the layer's 4 experts, fp32
    assert per_rank[0] == whole // 2
    assert math.isfinite(steps[-1]["loss"])
