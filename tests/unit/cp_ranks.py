"""Context parallelism of the GPT on 4 real gloo ranks in ONE elastic launch
(test_equivalence_cp.py).

    python tests/unit/cp_ranks.py OUT.pt

First as functions (gputui.train.context_parallel): on one batch, the ring's loss and every
gradient against the plain model's (each rank computes the reference itself), over cp = 2
(two rings: ranks 0-1 and 2-3) and cp = 4 (one ring of every rank), with the ring's hops
counted by a meter. Then as the strategies a run builds (SCENARIOS, through tp_ranks'
``strategy_scenario``: registry, config, text data, checkpoint and restore for RESUMED),
compared with ``single`` by the test: cp over 4 ranks, cp 2 x ddp 2 and cp 2 x fsdp 2, the
last also with full activation checkpointing, and cp 2 x tp 2.
"""

from __future__ import annotations

import os
import sys

import torch
from strategy_harness import ADAMW

SHAPE = {"vocab_size": 64, "context": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}
BATCH = 4

# name -> (strategy, global batch, config overrides): GPT_SMALL (context 32) with AdamW,
# warm-up + cosine and clipping
SCENARIOS = {
    "cp4": ("cp", 8, {**ADAMW}),
    "cp2_x_ddp2": ("mesh", 8, {"parallel.cp": 2, "parallel.dp_replicate": 2,
                               "parallel.dp_shard": 1, **ADAMW}),
    "cp2_x_fsdp2": ("mesh", 8, {"parallel.cp": 2, **ADAMW}),
    "cp2_x_fsdp2_ac_full": ("mesh", 8, {"parallel.cp": 2, "parallel.ac": "full", **ADAMW}),
    "cp2_x_tp2": ("mesh", 8, {"parallel.cp": 2, "parallel.tp": 2, "parallel.dp_shard": 1,
                              **ADAMW}),
}
# the scenarios whose checkpoint is restored too (tp_ranks.RESUMED's rule: one per layout):
# cp2_x_fsdp2's is cp2_x_fsdp2_ac_full's (Shard(0) over dp_shard_cp 4, AdamW)
RESUMED = ("cp4", "cp2_x_ddp2", "cp2_x_fsdp2_ac_full", "cp2_x_tp2")


def model():
    from gputui.train.gpt import GPTShape, gpt

    torch.manual_seed(0)
    return gpt(GPTShape(**SHAPE))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["context"] + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in m.named_parameters()}


def one_batch(group, meter=None) -> dict:
    """The plain model's loss and gradients on the batch, and the ring's over ``group`` (its
    loss averaged over the group, its gradients summed then averaged, as DDP does)."""
    import torch.distributed as dist

    from gputui.train.context_parallel import ContextParallel, apply_cp
    from gputui.train.gpt import lm_loss

    x, y = batch()
    ref = model()
    ref_loss = lm_loss(ref(x), y)
    ref_loss.backward()
    cp_model = model()
    cp = ContextParallel(group, meter, torch.device("cpu"))
    apply_cp(cp_model, cp)
    if meter is not None:
        meter.begin(0.0)
    with cp.step(x, y) as (xc, yc):
        loss = lm_loss(cp_model(xc), yc)
        loss.backward()
    if meter is not None:
        meter.finish()
    size = dist.get_world_size(group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    got = grads(cp_model)
    for g in got.values():
        dist.all_reduce(g, group=group)
        g /= size
    out = {"cp": size, "kind": cp.kind, "ref_loss": ref_loss.item(),
           "loss": total.item() / size, "grads": got, "ref_grads": grads(ref),
           "stats": {"hops": cp.stats.hops, "bytes": cp.stats.bytes,
                     "attention_s": cp.stats.attention_s}}
    if meter is not None:
        out["kinds"] = {k: len(v.marks) for k, v in meter.kinds.items()}
        out["comm_bytes"] = meter.comm_bytes
    # evaluation outside a step: the whole sequence, plain attention, as the plain model
    with torch.no_grad():
        out["eval_equal"] = torch.equal(cp_model(x), ref(x))
    return out


def rank_fn(workdir: str) -> dict:
    from datetime import timedelta

    import tp_ranks
    import torch.distributed as dist

    from gputui.train.strategies.meter import Meter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        rank = dist.get_rank()
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        out: dict = {"cp2": one_batch(pairs[rank // 2]),
                     "cp4": one_batch(dist.new_group([0, 1, 2, 3]), Meter([torch.device("cpu")]))}
        tp_ranks.SCENARIOS.update(SCENARIOS)
        out["strategies"] = {name: tp_ranks.strategy_scenario(name, workdir, name in RESUMED)
                             for name in SCENARIOS}
        return out
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(out: str) -> None:
    from rank_launch import launch

    torch.save(launch(rank_fn, 4, "cp", os.path.dirname(os.path.abspath(out))), out)


if __name__ == "__main__":
    main(sys.argv[1])
