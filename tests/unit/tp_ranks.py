"""Tensor parallelism and fsdp x tp of the GPT as functions (gputui.train.parallelize), on 4
real gloo ranks in ONE elastic launch: each rank trains the same tiny GPT from the same init
on the same batches and returns the full parameters and losses (test_parallelize.py).

    python tests/unit/tp_ranks.py OUT.pt

On a (2, 2) mesh: ``tp`` shards over the mesh's "tp" dimension only (each pair of ranks is
one tensor-parallel group on the whole batch), ``fsdp_tp`` adds fully_shard over "dp" (each
pair takes half of the batch).
"""

from __future__ import annotations

import sys

import torch

STEPS = 4
SHAPE = dict(vocab_size=64, context=16, n_layer=2, n_head=4, n_embd=32)
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


def train(m: torch.nn.Module, dp: int = 1, dp_rank: int = 0, timer=None) -> list[float]:
    """STEPS steps of m on this data-parallel slice of each batch; the slice losses."""
    from gputui.train.gpt import lm_loss

    opt = optimizer(m)
    losses = []
    for step in range(STEPS):
        x, y = (t.tensor_split(dp)[dp_rank] for t in batch(step))
        if timer is not None:
            timer.start_step(step == STEPS - 1)
        opt.zero_grad()
        loss = lm_loss(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def rank_fn() -> dict:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from gputui.train import parallelize as par
    from gputui.train.strategies.base import Stopwatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        timer = par.TPCommTimer(Stopwatch(torch.device("cpu")))
        tp_model = par.parallelize_gpt(model(), mesh["tp"], timer)
        out = {"tp": {"losses": train(tp_model, timer=timer),
                      "params": par.full_parameters(tp_model)},
               "spans": len(timer.spans), "nbytes": timer.nbytes}
        dp_rank = mesh["dp"].get_local_rank()
        both = par.fsdp_tp(model(), mesh)
        out["fsdp_tp"] = {"losses": train(both, 2, dp_rank),
                          "params": par.full_parameters(both)}
        return out
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(out: str) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gputui.train.agent import free_port

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=4, rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{free_port()}", run_id="tp",
                          rdzv_configs={"is_host": True}, max_restarts=0,
                          start_method="spawn", monitor_interval=0.1)
    torch.save(elastic_launch(config, rank_fn)(), out)


if __name__ == "__main__":
    main(sys.argv[1])
