"""Expert parallelism (parallel.ep) of the mixture-of-experts GPT equals single: on 4 real
gloo ranks (ep_ranks.py, one launch; cpu*2's is a real `gputui run`, test_moe.py), ep x ddp
and ep x fsdp give single's losses, first-step gradients (within what float32 rounding of a
reordered sum allows: RHO x the gradient's norm, tests/unit/rounding.py), parameters after
several clipped AdamW steps (within rounding.py's bound), validation score, routing (tokens
per expert) and, when the capacity drops assignments, single's very drops: the capacity rule
is one global rule (gputui.train.moe). The checkpoint restores the experts whole."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import ep_ranks
import pytest
import torch
from rounding import RHO, assert_equal_within_rounding, watch
from strategy_harness import assert_params_close, data_for, make_config

HERE = Path(__file__).resolve().parent


def single(extra: dict):
    """single on the scenario's model and batches: (strategy, losses, first-step gradients,
    routing per step, validation score); once per config."""
    key = tuple(sorted((k, str(v)) for k, v in extra.items() if not k.startswith("parallel.")))
    if key not in _SINGLE:
        _SINGLE[key] = _single(extra)
    return _SINGLE[key]


_SINGLE: dict = {}


def _single(extra: dict):
    from gputui.train import strategies
    from gputui.hw.discovery import resolve_devices
    from gputui.train.data import TensorBatches
    from gputui.train.loop import evaluate

    cfg = make_config("single", "cpu", "gpt", ep_ranks.BATCH, **{
        k: v for k, v in extra.items() if not k.startswith("parallel.")})
    ds = data_for(cfg)
    s = strategies.load("single")(cfg, resolve_devices("cpu"), ds.in_channels,
                                      ds.image_size, ds.num_classes)
    s.setup()
    watch(s)
    s.updater.plan(ep_ranks.STEPS)
    batches = TensorBatches(ds.train_x, ds.train_y, s.batch_size, cfg.run.seed)
    losses, grads, routing = [], None, []
    for x, y in itertools.islice(batches.epoch(1), ep_ranks.STEPS):
        losses.append(s.train_step(x, y).item())
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in s.primary_model().named_parameters()}
        routing.append(s.moe_stats())
    return s, losses, grads, routing, evaluate(s, ds)


@pytest.fixture(scope="module", params=[4], ids=lambda n: f"cpu*{n}")
def ranks(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"ep{world}") / "ranks.pt"
    proc = subprocess.run([sys.executable, str(HERE / "ep_ranks.py"), str(out), str(world)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return world, torch.load(out, weights_only=False)


@pytest.mark.slow
def test_ep_equals_single(ranks):
    world, got = ranks
    for name, (_, extra) in ep_ranks.SCENARIOS[world].items():
        ref, losses, grads, routing, score = single(extra)
        norm = math.sqrt(sum(g.double().pow(2).sum().item() for g in grads.values()))
        drops = extra["model.moe_capacity_factor"] > 0
        assert (sum(r["dropped"] for r in routing) > 0) == drops, name  # as the scenario says
        for rank in range(world):
            mine = got[rank][name]
            assert mine["losses"] == pytest.approx(losses, rel=1e-5), (name, rank)
            assert mine["grads"].keys() == grads.keys()
            for key, g in grads.items():  # a reordered sum's rounding, no more
                diff = (mine["grads"][key] - g).abs().max().item()
                assert diff <= RHO * norm, (name, rank, key, diff, RHO * norm)
            assert_equal_within_rounding(mine["params"], ref)
            # the same tokens per expert, kept and dropped, as single on every step
            for theirs, ours in zip(mine["routing"], routing, strict=True):
                for key in ("routed", "kept", "dropped", "layers"):
                    assert theirs[key] == ours[key], (name, rank, key)
                assert theirs["ep"] == extra.get("parallel.ep", 1)
            assert mine["score"] == pytest.approx(score, rel=1e-5)
            if name in ep_ranks.RESUMED:  # the checkpoint holds every expert whole and
                assert_params_close(mine["resumed_params"], mine["params"])  # restores them
                assert mine["next_loss"][0] == pytest.approx(mine["next_loss"][1], rel=1e-6)
        # each rank holds its ep share of the experts (the memory rows)
        ep = extra.get("parallel.ep", 1)
        rows = got[0][name]["memory"]
        whole = sum(p.numel() * 4 for n, p in ref.primary_model().named_parameters()
                    if ".experts." in n)
        assert [r["experts"] for r in rows] == [whole // ep] * world, name
        if ep > 1:
            assert any(f"groups of {ep} data-parallel ranks" in n
                       for n in got[0][name]["notes"]), name
