"""``fsdp_tp``: fsdp x tp on a 2-D ``(dp, tp)`` device mesh (see ``tp``, whose launch, steps,
evaluation and checkpoints it shares): tensor parallelism inside groups of ``strategy.tp_size``
ranks, the tp-sharded blocks and the whole model ``fully_shard``-ed over the groups, each group
taking its slice of the global batch. The metered step's comm is both: tp's all-reduces and
fully_shard's all-gathers and reduce-scatters, on one timer.
"""

from __future__ import annotations

from torch import nn

from gputui.core.config import ConfigError
from gputui.train.strategies.fsdp import FSDPStrategy
from gputui.train.strategies.tp import TPStrategy


class FSDPTPStrategy(TPStrategy):
    """2-D: tensor parallelism inside groups of ``strategy.tp_size`` ranks, fully_shard over
    the groups."""

    name = "fsdp_tp"

    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        self.tp = tp_size(self.cfg.strategy.tp_size, self.world_size)
        self.dp = self.world_size // self.tp
        mesh = init_device_mesh(self.device.type, (self.dp, self.tp),
                                mesh_dim_names=("dp", "tp"))
        self.dp_rank = mesh["dp"].get_local_rank()
        return mesh

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        from gputui.train.parallelize import blocks
        from gputui.train.strategies.fsdp_comm import FSDPCommTimer, install

        model = super().wrap(model)
        mesh = self.mesh_of_ranks
        for block in blocks(model):
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        if isinstance(self.comm, FSDPCommTimer):  # fully_shard's collectives on the same timer
            install(model, self.comm)  # (torch 2.8+; where it cannot, they stay in compute)
        if self.rank == 0:
            self.notes.append(f"{self.dp} x {self.tp} mesh: fully_shard over {self.dp} "
                              f"data-parallel group(s) of {self.tp} tensor-parallel ranks")
        return model

    def no_sync(self):
        """Accumulate without reduce-scattering: fsdp's no_sync (tp's has nothing to hold)."""
        return FSDPStrategy.no_sync(self)


def tp_size(asked: int, world: int) -> int:
    """Ranks per tensor-parallel group: ``strategy.tp_size``, or 0 for 2 (1 with one rank).
    A size that does not divide the world is a ConfigError."""
    size = asked or min(2, world)
    if world % size:
        raise ConfigError(f"strategy.tp_size = {size} does not divide the {world} ranks")
    return size


STRATEGY = FSDPTPStrategy
