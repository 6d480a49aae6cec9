"""Run ddp/fsdp scenarios on 2 real gloo ranks in ONE elastic launch, save what they trained.

    python tests/unit/ddp_scenarios.py OUT.pt [SPEC]

SPEC is the devices: "cpu*2" (the default: gloo ranks on the CPU) or "0,1" (one rank per GPU,
NCCL; the GPU suite's proof of the CUDA paths).

Used by test_equivalence_ddp.py (one launch instead of one per scenario: each launch costs
a torch import per process). Every rank builds the strategy exactly as a run does (registry,
config, rank and world size), walks the same global batches ``single`` sees in
strategy_harness, and returns its parameters (gathered to full tensors for fsdp), the
per-step losses reduced over ranks, and the test accuracy and loss through the loop's
evaluate_with_loss.
"""

from __future__ import annotations

import itertools
import sys

import torch

import user_lm
import user_model
from strategy_harness import ADAMW

STEPS = 5

# name -> (strategy, model, batch, config overrides, epochs of STEPS steps)
SCENARIOS = {
    "ddp_even": ("ddp", "lenet", 32, {}, 1),
    "ddp_odd": ("ddp", "mlp", 25, {}, 1),  # 13 / 12 examples
    "ddp_uneven": ("ddp", "lenet", 40, {"strategy.split_weights": [0.8, 0.2]}, 1),
    "ddp_micro": ("ddp", "mlp", 32, {"optim.micro_batches": 4}, 1),
    "fsdp": ("fsdp", "lenet", 32, {}, 1),
    "fsdp_micro": ("fsdp", "mlp", 32, {"optim.micro_batches": 2}, 1),
    "ddp_scaled": ("ddp", "lenet", 16, {"optim.scale_with_devices": True}, 1),  # 32 / 0.2
    "ddp_bf16": ("ddp", "mlp", 64, {"run.precision": "bf16"}, 6),
    "ddp_compiled": ("ddp", "mlp", 32, {"run.compile": "default"}, 1),
    # AdamW, warm-up then cosine, clipping: fsdp clips by the norm of its sharded gradients
    "ddp_adamw": ("ddp", "lenet", 32, ADAMW, 1),
    "fsdp_adamw": ("fsdp", "lenet", 32, ADAMW, 1),
    # a model of the user's own (user_model.py, named as a factory); fsdp shards its blocks
    "ddp_user": ("ddp", "lenet", 32, {"model.factory": user_model.NET}, 1),
    "fsdp_user": ("fsdp", "lenet", 32, {"model.factory": user_model.NET,
                                        "strategy.fsdp_wrap": ["Block"]}, 1),
    # a transformer of the user's own (blocks in a ModuleList, nn.MultiheadAttention) on
    # text, without naming its blocks: fsdp finds them inside the ModuleList
    "fsdp_user_transformer": ("fsdp", "lenet", 16, {"model.factory": user_lm.TRANSFORMER,
                                                    "data.name": "pystdlib",
                                                    "data.context": 32}, 1),
    # the built-in GPT on text (strategy_harness.GPT_SMALL): its tied head stays in the root
    # unit of fsdp, the blocks get a unit each
    "ddp_gpt": ("ddp", "gpt", 16, {}, 1),
    "fsdp_gpt": ("fsdp", "gpt", 16, {}, 1),
}


def build(name: str, spec: str):
    """The scenario's config, data and a set-up strategy on this rank."""
    import torch.distributed as dist

    from gputui.hw.discovery import resolve_devices
    from gputui.train import strategies
    from strategy_harness import data_for, make_config

    strategy_name, model, batch, extra, _ = SCENARIOS[name]
    cfg = make_config(strategy_name, spec, model, batch, **extra)
    ds = data_for(cfg)
    strategy = strategies.load(strategy_name)(
        cfg, resolve_devices(spec), ds.in_channels, ds.image_size, ds.num_classes,
        rank=dist.get_rank(), world_size=dist.get_world_size())
    strategy.setup()
    return cfg, ds, strategy


def checkpoint_round_trip(name: str, spec: str, trained, workdir: str) -> dict:
    """Save the trained strategy's checkpoint as a run does (rank 0 writes), restore it into
    a fresh strategy on every rank; returns the restored full parameters and its next loss."""
    import os

    import torch.distributed as dist

    from gputui.train import checkpoint as ckpt
    from strategy_harness import params

    path = os.path.join(workdir, f"{name}.pt")
    ckpt.save(path, trained, ckpt.Position(1, STEPS, STEPS), write=dist.get_rank() == 0)
    dist.barrier()
    _, _, fresh = build(name, spec)
    ckpt.restore(fresh, ckpt.load(path))
    opt_state = fresh.opt.state_dict()["state"]
    return {"resumed_params": params(fresh.full_model()), "resumed_steps": fresh.updater.steps,
            "resumed_opt_steps": sorted({float(s["step"]) for s in opt_state.values()
                                         if "step" in s})}


def run_scenario(name: str, spec: str = "cpu*2", workdir: str = "") -> dict:
    """Train one scenario on this rank; returns params, losses, accuracy (on the CPU) and
    every rank's memory rows; fsdp also what its checkpoint restores into a fresh strategy."""
    from gputui.train.data import TensorBatches
    from gputui.train.loop import evaluate_with_loss
    from gputui.train.strategies import fastpath
    from strategy_harness import params

    strategy_name, model, batch, extra, epochs = SCENARIOS[name]
    cfg, ds, strategy = build(name, spec)
    fastpath.compile_ahead(strategy, ds, lambda event: None)  # compiles before the first step
    strategy.updater.plan(epochs * STEPS)  # as the loop does: the schedule spans the run
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device())
    losses = []
    for epoch in range(1, epochs + 1):
        for x, y in itertools.islice(batches.epoch(epoch), STEPS):
            losses.append(strategy.train_step(x, y))
    losses = strategy.reduce_metric(torch.stack(losses)).tolist()
    model_ = strategy.full_model() if strategy_name == "fsdp" else strategy.module
    acc, test_loss = evaluate_with_loss(strategy, ds)
    out = {"params": params(model_), "losses": losses, "acc": acc, "test_loss": test_loss,
           "batch_size": strategy.batch_size, "shard": len(strategy.shard(x, y)[0]),
           "memory": [r.to_dict() for r in strategy.memory_rows(None)]}
    if strategy_name == "fsdp" and name in ("fsdp", "fsdp_adamw"):
        out.update(checkpoint_round_trip(name, spec, strategy, workdir))
    return out


DELAY = 0.05  # seconds injected by the breakdown scenarios
FSDP_DELAY = 0.01  # ... on each of fsdp's collectives (several a step)
SLOW_MS = 60.0  # added to rank 1's backward by the straggler scenarios
# name -> config overrides of a ddp (or fsdp) run through the real loop, every step metered
BREAKDOWN = {"plain": {}, "comm_delay": {"debug.comm_delay_s": DELAY},
             "data_delay": {"debug.data_delay_s": DELAY},
             "fsdp_plain": {"strategy.name": "fsdp"},
             "fsdp_comm_delay": {"strategy.name": "fsdp", "debug.comm_delay_s": FSDP_DELAY},
             "slow_rank": {"debug.slow_rank": 1, "debug.slow_backward_ms": SLOW_MS},
             "fsdp_slow_rank": {"strategy.name": "fsdp", "debug.slow_rank": 1,
                                "debug.slow_backward_ms": SLOW_MS}}


def run_breakdown(name: str, spec: str = "cpu*2") -> list[list]:
    """One epoch (10 steps) of ddp through the loop with log_every 1; returns every step's
    per_device rows (each rank's breakdown, gathered)."""
    import torch.distributed as dist

    from gputui.hw.discovery import resolve_devices
    from gputui.train import strategies
    from gputui.train.data import TensorBatches
    from gputui.train.loop import train
    from strategy_harness import make_config, small_data

    extra = dict(BREAKDOWN[name])
    which = extra.pop("strategy.name", "ddp")
    cfg = make_config(which, spec, "lenet", 32, **{"run.log_every": 1, "run.epochs": 1},
                      **extra)
    ds = small_data()
    strategy = strategies.load(which)(
        cfg, resolve_devices(spec), ds.in_channels, ds.image_size, ds.num_classes,
        rank=dist.get_rank(), world_size=dist.get_world_size())
    strategy.setup()
    batches = TensorBatches(ds.train_x, ds.train_y, strategy.batch_size, cfg.run.seed,
                            strategy.data_device())
    events = []
    train(cfg, strategy, batches, ds, events.append, lambda: False)
    return [list(e.per_device) for e in events if e.kind == "step"]


class _Asked:
    """A rank's stop flag as the worker hands it to AgreedStop: asked or not, and why."""

    def __init__(self, reason: str | None):
        self.reason = reason or ""

    def __call__(self) -> bool:
        return bool(self.reason)


def agreed_stops(spec: str) -> list[dict]:
    """The worker's AgreedStop over a real ddp strategy's agreement: rank 1 asks to stop for
    SIGTERM (as a signal lands on one node of a SLURM job first), then rank 0 for the user
    while rank 1 asks nothing, then both for their own reasons, then rank 0 for a reason the
    shared table does not name. Each check: what this rank
    decided and the reason it records."""
    import torch.distributed as dist

    from gputui.core.signals import stop_reason
    from gputui.train.stopping import AgreedStop

    _, _, strategy = build("ddp_even", spec)
    rank = dist.get_rank()
    asks = [(None, stop_reason(15)), ("stopped by user", None),
            ("stopped by user", "something else"), ("something else", None)]
    out = []
    for mine in asks:
        strategy._stop_countdown = 1  # check at this call (the agreement's cadence aside)
        stop = AgreedStop(_Asked(mine[rank]), strategy)
        out.append({"stop": stop(), "reason": stop.reason})
    return out


def rank_fn(spec: str = "cpu*2", workdir: str = "") -> dict:
    """Every scenario on this rank, in one process group."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    gpus = not spec.startswith("cpu")
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl" if gpus else "gloo", timeout=timedelta(seconds=60))
    try:
        out = {name: run_scenario(name, spec, workdir) for name in SCENARIOS}
        out["breakdown"] = {name: run_breakdown(name, spec) for name in BREAKDOWN}
        out["agreed_stops"] = agreed_stops(spec)
        return out
    finally:
        from gputui.train.strategies.rank import destroy_group

        dist.barrier()
        destroy_group()


def main(out: str, spec: str = "cpu*2") -> None:
    import os

    from rank_launch import launch

    # ddp_compiled's inductor: imported once by the server, not by each rank
    results = launch(rank_fn, 2, "scenarios", spec, os.path.dirname(os.path.abspath(out)),
                     preload=("torch._inductor.compile_fx",), cpu=spec.startswith("cpu"))
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
