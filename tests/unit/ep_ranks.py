"""Expert parallelism of the mixture-of-experts GPT on real gloo ranks, ONE elastic launch per
world size (test_equivalence_ep.py): each scenario builds its strategy as a run does
(registry, config, the text data), trains STEPS steps and returns what the test compares
with ``single``: the losses, the gradients of the first step (gathered whole), the
parameters, the routing (tokens per expert, dropped), the memory rows, what its checkpoint
restores.

    python tests/unit/ep_ranks.py OUT.pt RANKS
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
from strategy_harness import ADAMW

STEPS = 3
BATCH = 16
# the MoE GPT of the scenarios: GPT_SMALL's blocks with 4 experts each
MOE = {"model.moe_experts": 4, "model.moe_top_k": 2, "model.moe_aux_weight": 0.01, **ADAMW}
NO_DROP = {"model.moe_capacity_factor": 0.0}  # no capacity limit: no assignment dropped
DROPS = {"model.moe_capacity_factor": 0.5}  # half the even share: many dropped
# world size -> name -> (strategy, config overrides)
# (cpu*2's is a real `gputui run`: test_moe.py)
SCENARIOS: dict[int, dict[str, tuple[str, dict]]] = {
    4: {
        # two ep groups of 2: each expert's gradient summed over its 2 replicas
        "ddp_ep2": ("ddp", {**MOE, **NO_DROP, "parallel.ep": 2}),
        # one ep group of 4, one expert a rank, top-1 (Switch); fully_shard the rest
        "fsdp_ep4_top1": ("fsdp", {**MOE, **NO_DROP, "model.moe_top_k": 1,
                                   "parallel.ep": 4}),
        # the capacity drops: the same assignments as single's on the same batch
        "fsdp_ep2_drops": ("fsdp", {**MOE, **DROPS, "parallel.ep": 2}),
        # a MoE GPT under plain ddp (ep 1): the capacity rule spans the ranks all the same
        "ddp_ep1_drops": ("ddp", {**MOE, **DROPS}),
    },
}

# the scenarios whose checkpoint is restored and trained on (one of ddp's, one of fsdp's)
RESUMED = ("ddp_ep2", "fsdp_ep2_drops")


def full_grads(strategy) -> dict[str, torch.Tensor]:
    """Every parameter's gradient whole, by name (a collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    out = {}
    experts = {n for n, _, _ in strategy._expert_entries()} if strategy._experts else set()
    for name, p in sorted(strategy.module.named_parameters()):
        g = p.grad
        if isinstance(g, DTensor):
            g = g.full_tensor()
        elif name in experts:
            g = strategy._gathered(g)
        out[name] = g.detach().cpu().clone()
    return out


def scenario(world: int, name: str, workdir: str) -> dict:
    import torch.distributed as dist
    from strategy_harness import data_for, make_config, params

    from gputui.train import strategies
    from gputui.hw.discovery import resolve_devices
    from gputui.train import checkpoint as ckpt
    from gputui.train.data import TensorBatches
    from gputui.train.loop import evaluate

    which, extra = SCENARIOS[world][name]
    spec = f"cpu*{world}"
    cfg = make_config(which, spec, "gpt", BATCH, **extra)
    ds = data_for(cfg)

    def build():
        s = strategies.load(which)(cfg, resolve_devices(spec), ds.in_channels,
                                       ds.image_size, ds.num_classes, rank=dist.get_rank(),
                                       world_size=world)
        s.setup()
        s.updater.plan(STEPS)
        return s

    strategy = build()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device())
    losses, grads, routing = [], None, []
    for x, y in itertools.islice(batches.epoch(1), STEPS):
        losses.append(strategy.train_step(x, y))
        if grads is None:
            grads = full_grads(strategy)
        routing.append(strategy.moe_stats())
    out = {"losses": strategy.reduce_metric(torch.stack(losses)).tolist(), "grads": grads,
           "routing": routing, "params": params(strategy.full_model()),
           "score": evaluate(strategy, ds), "memory": [r.to_dict() for r in
                                                             strategy.memory_rows(None)],
           "notes": list(strategy.notes)}
    if name not in RESUMED:
        return out
    path = os.path.join(workdir, f"ep{world}-{name}.pt")
    ckpt.save(path, strategy, ckpt.Position(1, STEPS, STEPS), write=dist.get_rank() == 0)
    dist.barrier()
    fresh = build()
    ckpt.restore(fresh, ckpt.load(path))
    out["resumed_params"] = params(fresh.full_model())
    # the restored run trains on as the first would: one more step each, the same loss
    x, y = next(iter(batches.epoch(2)))
    out["next_loss"] = [strategy.reduce_metric(strategy.train_step(x, y)).item(),
                        fresh.reduce_metric(fresh.train_step(x, y)).item()]
    return out


def rank_fn(world: int, workdir: str) -> dict:
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        return {name: scenario(world, name, workdir) for name in SCENARIOS[world]}
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(out: str, ranks: str) -> None:
    from rank_launch import launch

    world = int(ranks)
    torch.save(launch(rank_fn, world, "ep", world, os.path.dirname(os.path.abspath(out))), out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
