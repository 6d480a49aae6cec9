"""``tp``: tensor parallelism of the built-in GPT, and ``fsdp_tp``: fsdp x tp on a 2-D mesh.

Launched like ddp, one process per device (this class holds only what differs). ``tp``: every
rank holds its share of each block's heads and MLP width (``gputui.train.parallelize``), sees
the whole global batch and computes the same loss; the block's activations are all-reduced
(4 per block and step), the gradients need no sync at all. ``fsdp_tp``: the ranks form a
``(dp, tp)`` mesh of ``strategy.tp_size`` ranks per tensor-parallel group; each group takes
its dp slice of the batch, and fully_shard shards the tp-sharded blocks over dp (all-gathers
and reduce-scatters, as fsdp). Evaluation runs the sharded model on every rank of a group
(its forward is a collective); a checkpoint holds the full state, gathered as fsdp's.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from gputui.core.config import ConfigError
from gputui.train.strategies.base import no_correct
from gputui.train.strategies.fsdp import FSDPStrategy


class TPStrategy(FSDPStrategy):
    """The GPT's blocks sharded over all the ranks: a tensor-parallel group of world size."""

    name = "tp"
    dp: int  # data-parallel groups (1 for tp)
    dp_rank: int  # this rank's group
    tp: int  # ranks per tensor-parallel group
    mesh_of_ranks: Any  # the DeviceMesh (1-D "tp", or 2-D "dp" x "tp")

    def mesh(self):
        """The device mesh: 1-D over every rank for tp."""
        from torch.distributed.device_mesh import init_device_mesh

        self.dp, self.dp_rank, self.tp = 1, 0, self.world_size
        return init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("tp",))

    def wrap(self, model: nn.Module) -> nn.Module:
        from gputui.train.parallelize import TPCommTimer, parallelize_gpt

        mesh = self.mesh_of_ranks = self.mesh()
        self.comm = TPCommTimer(self.meter, delay_s=self.comm_delay_s, count_bytes=self.dp == 1)
        try:
            parallelize_gpt(model, mesh["tp"], self.comm)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.rank == 0:
            sees = "every rank sees the whole batch" if self.dp == 1 else \
                "each tensor-parallel group sees its slice of the batch"
            self.notes.append(f"attention heads and MLP width split over {self.tp} ranks "
                              f"(q, k, v, fc column-wise; the projections row-wise); {sees}")
        return model

    def compiles(self) -> bool:
        """Not here: torch.compile over the DTensor hooks of parallelize_module is not tried
        on this path (gloo on the CPU); the run says so and trains eager."""
        if self.cfg.run.compile != "off" and self.rank == 0:
            self.notes.append(f"run.compile does not apply to {self.name} here; eager")
        return False

    def no_sync(self):
        """Nothing to hold back: tp's gradients are not synchronised."""
        return contextlib.nullcontext()

    def shard(self, x: torch.Tensor, y: torch.Tensor):
        """This rank's data-parallel group's slice of the batch (tp: all of it)."""
        if self.dp == 1:
            return x, y
        return (torch.tensor_split(x, self.dp)[self.dp_rank],
                torch.tensor_split(y, self.dp)[self.dp_rank])

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        m = self.meter.begin(data_s)  # the comm timer marks while the meter is on
        total = len(x)
        xs, ys = self.shard(x, y)
        self.opt.zero_grad(set_to_none=True)
        with m.compute:  # tp's all-reduces run inside forward and backward (TPCommTimer)
            # the dp groups' gradients are averaged (fully_shard), tp's are not synced at all
            loss = self.forward_backward(self.model, xs, ys, total / self.dp, self.device,
                                         before_last=self.no_sync)
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(xs))
        return loss

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The score (``score``) of this group's slice of the test batch, times dp (the mean
        over ranks is then the batch's); a group with an empty slice still runs a forward (on
        one example, counted nowhere): every forward is a collective."""
        xs = torch.tensor_split(x, self.dp)[self.dp_rank]
        ys = torch.tensor_split(y, self.dp)[self.dp_rank]
        with self.autocast(self.device):
            if len(xs) == 0:
                self.model(x[:1])
                return no_correct(self.device)
            out = self.model(xs)
        return self.score(out, ys) * self.dp


STRATEGY = TPStrategy
