"""Tensor parallelism and fsdp x tp of the GPT on 4 real gloo ranks in ONE elastic launch
(test_parallelize.py): as functions (gputui.train.parallelize: each rank trains the same tiny
GPT from the same init on the same batches), and as the strategies a run builds (registry,
config, the text data; SCENARIOS, compared with ``single`` by the test). Each returns the full
parameters and the losses.

    python tests/unit/tp_ranks.py OUT.pt

On a (2, 2) mesh: ``tp`` shards over the mesh's "tp" dimension only (each pair of ranks is
one tensor-parallel group on the whole batch), ``fsdp_tp`` adds fully_shard over "dp" (each
pair takes half of the batch).
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
from strategy_harness import ADAMW

STEPS = 4
SHAPE = {"vocab_size": 64, "context": 16, "n_layer": 2, "n_head": 4, "n_embd": 32}
BATCH = 8


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["context"] + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def model():
    from gputui.train.gpt import GPTShape, gpt

    torch.manual_seed(0)
    return gpt(GPTShape(**SHAPE))


def optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1)


def train(m: torch.nn.Module, dp: int = 1, dp_rank: int = 0, meter=None) -> list[float]:
    """STEPS steps of m on this data-parallel slice of each batch; the slice losses."""
    from gputui.train.gpt import lm_loss

    opt = optimizer(m)
    losses = []
    for step in range(STEPS):
        x, y = (t.tensor_split(dp)[dp_rank] for t in batch(step))
        if meter is not None:  # the last step metered
            meter.begin(0.0 if step == STEPS - 1 else None)
        opt.zero_grad()
        loss = lm_loss(m(x), y)
        loss.backward()
        opt.step()
        if meter is not None:
            meter.finish()
        losses.append(loss.item())
    return losses


# name -> (strategy, global batch, config overrides): the GPT of strategy_harness.GPT_SMALL
SCENARIOS = {
    "tp4": ("tp", 16, {"model.n_head": 4}),  # 4 heads over the 4 ranks, the whole batch each
    "fsdp_tp": ("fsdp_tp", 16, {"strategy.tp_size": 2}),  # 2 x 2, half the batch per group
}
# AdamW, warm-up + cosine and clipping by the global norm of DTensor and plain gradients
SCENARIOS["tp4_adamw"] = ("tp", 16, {"model.n_head": 4, **ADAMW})
SCENARIOS["fsdp_tp_adamw"] = ("fsdp_tp", 16, {"strategy.tp_size": 2, **ADAMW})
# the mesh: combinations the named strategies lack, the ZeRO stages and activation
# checkpointing, each with AdamW, warm-up + cosine and clipping
MESH = {
    "hsdp": {"parallel.dp_replicate": 2, "parallel.dp_shard": 2},  # 2 replicas of 2 shards
    "dp_x_tp": {"parallel.dp_replicate": 2, "parallel.dp_shard": 1, "parallel.tp": 2},
    "shard_x_tp_selective": {"parallel.dp_shard": 2, "parallel.tp": 2,
                             "parallel.ac": "selective"},
    "hsdp_zero1": {"parallel.dp_replicate": 2, "parallel.dp_shard": 2, "parallel.zero": 1},
    # pipelines beside the other dimensions: 2 stages, each fully_shard-ed, DDP-replicated or
    # tensor-parallel over the other 2 ranks
    "pp_x_shard": {"parallel.pp": 2, "strategy.pipeline_chunks": 2},
    "pp_x_replicate": {"parallel.pp": 2, "parallel.dp_replicate": 2, "parallel.dp_shard": 1,
                       "strategy.pipeline_chunks": 2},
    "pp_x_tp": {"parallel.pp": 2, "parallel.tp": 2, "parallel.dp_shard": 1,
                "strategy.pipeline_chunks": 2, "strategy.schedule": "gpipe"},
}
SCENARIOS.update({name: ("mesh", 16, {**extra, **ADAMW}) for name, extra in MESH.items()})
SCENARIOS["fsdp_zero1"] = ("fsdp", 16, {"parallel.zero": 1, **ADAMW})
SCENARIOS["fsdp_zero2"] = ("fsdp", 16, {"parallel.zero": 2, **ADAMW})
SCENARIOS["fsdp_ac_full"] = ("fsdp", 16, {"parallel.ac": "full", **ADAMW})
SCENARIOS["ddp_ac_selective"] = ("ddp", 16, {"parallel.ac": "selective", **ADAMW})
# The scenarios whose checkpoint is saved and restored into a fresh strategy: one for each
# checkpoint layout (the strategy's state-dict path, its parameters' placements over their
# mesh, its optimizer's state; activation checkpointing leaves the parameter names alone).
# The others have the layout of one kept here, and every one of them trains, scores and
# reports its memory all the same:
#   tp4_adamw: tp4's placements (Shard(0), Shard(1), Replicate over tp 4) with AdamW's
#     state, which fsdp_tp_adamw's DTensors round-trip
#   fsdp_tp, shard_x_tp_selective: fsdp_tp_adamw's placements on (dp_shard 2, tp 2) (SGD's
#     momentum on DTensors: tp4's)
#   fsdp_zero2: fsdp_ac_full's (Shard(0) over dp_shard 4, AdamW; at rest zero2 is resharded)
RESUMED = ("tp4", "fsdp_tp_adamw", "hsdp", "dp_x_tp", "hsdp_zero1", "pp_x_shard",
           "pp_x_replicate", "pp_x_tp", "fsdp_zero1", "fsdp_ac_full", "ddp_ac_selective")


def single_reference(size: int, extra: dict):
    """``single`` on a scenario's model, global batch and optimizer (its ``strategy.`` and
    ``parallel.`` keys dropped), trained STEPS steps in the test's process: (strategy, losses,
    validation score); strategy_harness keeps it per config (most scenarios share one)."""
    from strategy_harness import make_config
    from strategy_harness import single_reference as reference

    extra = {k: v for k, v in extra.items() if not k.startswith(("strategy.", "parallel."))}
    strategy, losses, (score, _) = reference(make_config("single", "cpu", "gpt", size, **extra),
                                             STEPS)
    return strategy, losses, score


def strategy_scenario(name: str, workdir: str, resume: bool = True) -> dict:
    """Train a scenario's strategy STEPS steps as a run does; its full parameters, losses
    (reduced over the ranks), test score, memory rows, and (``resume``) what its checkpoint
    restores."""
    import os

    import torch.distributed as dist
    from strategy_harness import data_for, make_config, params

    from gputui.train import strategies
    from gputui.hw.discovery import resolve_devices
    from gputui.train import checkpoint as ckpt
    from gputui.train.data import TensorBatches
    from gputui.train.loop import evaluate

    which, size, extra = SCENARIOS[name]

    spec = f"cpu*{dist.get_world_size()}"

    def build():
        s = strategies.load(which)(cfg, resolve_devices(spec), ds.in_channels,
                                       ds.image_size, ds.num_classes, rank=dist.get_rank(),
                                       world_size=dist.get_world_size())
        s.setup()
        s.updater.plan(STEPS)  # the schedule over the steps taken, as run_steps plans it
        return s

    cfg = make_config(which, spec, "gpt", size, **extra)
    ds = data_for(cfg)
    strategy = build()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device())
    losses = [strategy.train_step(x, y) for x, y in
              itertools.islice(batches.epoch(1), STEPS)]
    out = {"losses": strategy.reduce_metric(torch.stack(losses)).tolist(),
           "params": params(strategy.full_model()), "score": evaluate(strategy, ds),
           "memory": [r.to_dict() for r in strategy.memory_rows(None)],
           "batch_size": strategy.batch_size}
    if not resume:
        return out
    path = os.path.join(workdir, f"{name}.pt")
    ckpt.save(path, strategy, ckpt.Position(1, STEPS, STEPS), write=dist.get_rank() == 0)
    dist.barrier()
    fresh = build()
    ckpt.restore(fresh, ckpt.load(path))
    out["resumed_params"] = params(fresh.full_model())
    return out


def rank_fn(workdir: str) -> dict:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from gputui.train import parallelize as par
    from gputui.train.strategies.meter import Meter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        meter = Meter([torch.device("cpu")])
        tp_model = par.apply_tp(model(), mesh["tp"], par.TPCommTimer(meter))
        out = {"tp": {"losses": train(tp_model, meter=meter),
                      "params": par.full_parameters(tp_model)},
               "spans": len(meter.comm.marks), "nbytes": meter.comm_bytes,
               "kinds": {k: len(v.marks) for k, v in meter.kinds.items()}}
        dp_rank = mesh["dp"].get_local_rank()
        # the composition a run uses: tp, then fully_shard over the other dimension
        from gputui.core.mesh import MeshShape

        shape = MeshShape(dp_shard=2, tp=2)
        both, _ = par.parallelize(model(), init_device_mesh(
            "cpu", (2, 2), mesh_dim_names=("dp_shard", "tp")), shape, [])
        out["fsdp_tp"] = {"losses": train(both, 2, dp_rank),
                          "params": par.full_parameters(both)}
        out["strategies"] = {name: strategy_scenario(name, workdir, name in RESUMED)
                             for name in SCENARIOS}
        return out
    finally:
        dist.barrier()
        dist.destroy_process_group()


# 3-D on 8 ranks: 2 pipeline stages, each tensor-parallel over 2 ranks and fully_shard-ed
# over 2 (launched on its own: ``tp_ranks.py OUT 8``)
SCENARIOS8 = {"dp_x_tp_x_pp": ("mesh", 16, {"parallel.pp": 2, "parallel.tp": 2,
                                            "strategy.pipeline_chunks": 2, **ADAMW})}


def rank_fn8(workdir: str) -> dict:
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        SCENARIOS.update(SCENARIOS8)
        return {"strategies": {name: strategy_scenario(name, workdir) for name in SCENARIOS8}}
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(out: str, ranks: str = "4") -> None:
    from rank_launch import launch

    fn = rank_fn if ranks == "4" else rank_fn8
    torch.save(launch(fn, int(ranks), "tp", os.path.dirname(os.path.abspath(out))), out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
