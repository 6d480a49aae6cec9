"""Run pp scenarios on 2 real gloo ranks in ONE elastic launch, save what they trained.

    python tests/unit/pp_scenarios.py OUT.pt [SPEC]

Used by test_equivalence_pp.py. Every rank builds the strategy exactly as a run does
(registry, config, rank and world size), walks the same global batches ``single`` sees in
strategy_harness, and returns the whole model's parameters (gathered from the stages), the
per-step losses reduced over ranks, the test score and loss through the loop's
evaluate_with_loss (accuracy, or the GPT's validation loss on text), and what a checkpoint
restores into a fresh strategy.
"""

from __future__ import annotations

import itertools
import sys

import torch

import user_model
from strategy_harness import ADAMW

STEPS = 4

# name -> (model, batch, config overrides)
SCENARIOS = {
    "gpipe_mlp": ("mlp", 32, {"strategy.schedule": "gpipe", "strategy.pipeline_chunks": 4}),
    "1f1b_lenet": ("lenet", 24, {"strategy.schedule": "1f1b", "strategy.pipeline_chunks": 3,
                                 "optim.micro_batches": 2}),
    "gpipe_gpt": ("gpt", 8, {"strategy.schedule": "gpipe", "strategy.pipeline_chunks": 4}),
    "1f1b_gpt": ("gpt", 8, {"strategy.schedule": "1f1b", "strategy.pipeline_chunks": 2}),
    # AdamW, warm-up + cosine, clipping by the norm over both stages (the tied weight once)
    "1f1b_gpt_adamw": ("gpt", 8, {"strategy.schedule": "1f1b", "strategy.pipeline_chunks": 2,
                                  **ADAMW}),
    # every other schedule this torch has: several stages a rank (looped, interleaved), the
    # zero-bubble ones (backward split into input and weight gradients), the V placements
    # (the tied head and embedding on one rank, one parameter); AdamW, schedule, clipping
    **{f"{kind}_gpt": ("gpt", 8, {"strategy.schedule": kind, "strategy.pipeline_chunks": chunks,
                                  **ADAMW})
       for kind, chunks in (("interleaved_1f1b", 2), ("looped_bfs", 2), ("interleaved_zb", 2),
                            ("zbv", 4), ("dualpipev", 4))},
    # the user's own model, not a Sequential: its gputui_blocks() are the stages' blocks
    "gpipe_user": ("lenet", 16, {"model.factory": user_model.NET, "strategy.schedule": "gpipe",
                                 "strategy.pipeline_chunks": 2}),
}
# The scenarios whose checkpoint is saved and restored into a fresh strategy: one for each
# layout of the stages on the ranks (and model, optimizer); the schedule does not enter the
# checkpoint. 1f1b_gpt's is gpipe_gpt's (one stage a rank, SGD); looped_bfs_gpt's and
# interleaved_zb_gpt's interleaved_1f1b_gpt's (stages 0, 2 and 1, 3, AdamW); dualpipev_gpt's
# zbv_gpt's (the V: stages 0, 3 and 1, 2, AdamW).
RESUMED = ("gpipe_mlp", "1f1b_lenet", "gpipe_gpt", "1f1b_gpt_adamw", "interleaved_1f1b_gpt",
           "zbv_gpt", "gpipe_user")


def build(strategy: str, spec: str, model: str, batch: int, extra: dict, rank: int = 0,
          world_size: int = 1, cfg=None):
    """(set-up strategy, an iterator of its global batches, the dataset) as a run has them;
    ``cfg``: the config made (and checked) already, as a run's ranks get the host's."""
    from gputui.train import strategies
    from gputui.hw.discovery import resolve_devices
    from gputui.train.data import TensorBatches
    from strategy_harness import data_for, make_config

    cfg = cfg or make_config(strategy, spec, model, batch, **extra)
    ds = data_for(cfg)
    s = strategies.load(strategy)(cfg, resolve_devices(spec), ds.in_channels,
                                      ds.image_size, ds.num_classes, rank=rank,
                                      world_size=world_size)
    s.setup()
    s.updater.plan(STEPS)  # the schedule over the steps the scenarios take
    return s, TensorBatches(ds.train_x, ds.train_y, s.batch_size, cfg.run.seed).epoch(1), ds


def config(name: str, spec: str):
    """A scenario's pp config, made and checked (gputui.runs.prepare: a model.factory's cut
    is checked in a child process) once, by the launching process."""
    from strategy_harness import make_config

    model, batch, extra = SCENARIOS[name]
    return make_config("pp", spec, model, batch, **extra)


def run_scenario(name: str, spec: str, workdir: str, cfg) -> dict:
    import os

    import torch.distributed as dist

    from gputui.train import checkpoint as ckpt
    from gputui.train.loop import evaluate_with_loss
    from strategy_harness import params

    model, batch, extra = SCENARIOS[name]
    strategy, batches, ds = build("pp", spec, model, batch, extra, rank=dist.get_rank(),
                                  world_size=dist.get_world_size(), cfg=cfg)
    losses = [strategy.train_step(x, y, data_s=0.0) for x, y in itertools.islice(batches, STEPS)]
    losses = strategy.reduce_metric(torch.stack(losses)).tolist()
    report = strategy.step_report()
    out = {"params": params(strategy.full_model()), "losses": losses,
           "score": evaluate_with_loss(strategy, ds),  # (accuracy or val loss, test loss)
           "rows": [r.to_dict() for r in report.devices], "notes": list(strategy.notes),
           "memory": [r.to_dict() for r in strategy.memory_rows(None)],
           "state": strategy.state_dict()["models"][0]}  # every stage's own tensors
    if name not in RESUMED:
        return out
    path = os.path.join(workdir, f"{name}.pt")
    ckpt.save(path, strategy, ckpt.Position(1, STEPS, STEPS), write=dist.get_rank() == 0)
    dist.barrier()
    fresh, _, _ = build("pp", spec, model, batch, extra, rank=dist.get_rank(),
                        world_size=dist.get_world_size(), cfg=cfg)
    ckpt.restore(fresh, ckpt.load(path))
    out["resumed"] = params(fresh.full_model())
    return out


def rank_fn(spec: str = "cpu*2", workdir: str = "", configs: dict | None = None) -> dict:
    """Every scenario on this rank, in one process group (``configs``: theirs, by name)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    gpus = not spec.startswith("cpu")
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if gpus else "gloo", timeout=timedelta(seconds=60))
    try:
        configs = configs or {name: config(name, spec) for name in SCENARIOS}
        return {name: run_scenario(name, spec, workdir, configs[name]) for name in SCENARIOS}
    finally:
        from gputui.train.strategies.rank import destroy_group

        dist.barrier()
        destroy_group()


def main(out: str, spec: str = "cpu*2") -> None:
    import os

    from rank_launch import launch

    configs = {name: config(name, spec) for name in SCENARIOS}  # the ranks take these
    results = launch(rank_fn, 2, "pp-scenarios", spec, os.path.dirname(os.path.abspath(out)),
                     configs, cpu=spec.startswith("cpu"))
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
