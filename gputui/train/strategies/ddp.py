"""``ddp``: DistributedDataParallel, one process per device, launched by torch's elastic agent.

Each rank (see ``gputui.train.ranks``) walks the same global batches ``single`` sees and
takes its shard (even, or by ``split_weights``). Its loss is summed and divided by the global
batch over the world size, so DDP's gradient averaging yields exactly the full-batch gradient,
even for uneven shards. With micro-batches, DDP's gradient sync runs on the last one only
(``no_sync``).

The process group, the agreed stop and the gathered figures are every rank strategy's
(``process_group.RankStrategy``). Metrics are combined as means over ranks: each rank reports
its share scaled to the whole (share x world size), so ``reduce_metric`` (sum / world size)
gives the global figure; each rank's metered step (a ``DeviceStep``) is gathered whole at the
log interval.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import nn

from gputui.train.strategies.base import no_correct
from gputui.train.strategies.comm_timer import CommTimer
from gputui.train.strategies.process_group import RankStrategy
from gputui.train.strategies.scratch import split_sizes


class DDPStrategy(RankStrategy):
    """The model wrapped in DistributedDataParallel on this rank's device."""

    name = "ddp"
    module: nn.Module
    model: nn.Module  # what a step calls: the module wrapped (ddp) or sharded (fsdp)
    opt: torch.optim.Optimizer
    weights: list[float] | None  # every rank's share of a batch (strategy.split_weights)
    _shard: dict[int, tuple[int, int]]

    def setup(self) -> None:
        self.join_group()  # this rank's device, the process group, the meter
        self.module = self.build_model().to(self.device)  # parameter names, eval, checkpoints
        self.model = self.wrap(self.module)
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.device)
        weights, n_local = self.cfg.strategy.split_weights, len(self.devices)
        # split_weights name the local devices; every node has the same layout
        self.weights = [weights[r % n_local] for r in range(self.world_size)] if weights else None
        self._shard: dict[int, tuple[int, int]] = {}  # batch size -> (start, size), once
        if not self.cuda and self.rank == 0:
            self.notes.append(f"{self.world_size} {self.backend} ranks on the CPU, "
                              f"{torch.get_num_threads()} thread(s) each")
        elif self.rank == 0:
            self.notes.append(f"{self.world_size} {self.backend} rank(s), one per GPU")

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP around the model (buckets overlap the all-reduce with backward; gradients are
        views into the buckets, which saves a copy of every gradient per step)."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.cuda else None
        # DDP runs the flattened (and, with run.compile, compiled: torch.compile around DDP
        # breaks its graph at DDP's own forward) model; self.module is the model itself
        ddp = DistributedDataParallel(self.fast(self.lean(model)), device_ids=ids,
                                      gradient_as_bucket_view=True)
        # times the gradient sync on metered steps (and delays it, under debug.comm_delay_s)
        timer = CommTimer(self.meter, delay_s=self.comm_delay_s)
        ddp.register_comm_hook(None, timer.hook)
        self.comm = timer
        return ddp

    def no_sync(self):
        """Context for every micro-batch but the last: accumulate without all-reducing."""
        from torch.nn.parallel import DistributedDataParallel

        return cast(DistributedDataParallel, self.model).no_sync()  # what wrap made

    def models(self) -> list[nn.Module]:
        return [self.module]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    # ---------------------------------------------------------------- training
    def shard(self, x: torch.Tensor, y: torch.Tensor):
        """This rank's slice of the global batch."""
        cut = self._shard.get(len(x))
        if cut is None:
            sizes = split_sizes(len(x), self.world_size, self.weights)
            cut = self._shard[len(x)] = (sum(sizes[:self.rank]), sizes[self.rank])
        lo, n = cut
        return x[lo:lo + n], y[lo:lo + n]

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        m = self.meter.begin(data_s)  # the comm timer marks while the meter is on
        total = len(x)
        xs, ys = self.shard(x, y)
        self.opt.zero_grad(set_to_none=True)
        with m.compute:  # DDP's buckets are all-reduced inside backward (comm_timer)
            # / (total / world): DDP divides the summed gradients by the world size again
            loss = self.forward_backward(self.model, xs, ys, total / self.world_size,
                                         self.device, before_last=self.no_sync)
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(xs))
        return loss

    # ---------------------------------------------------------------- evaluation
    def set_train(self, mode: bool) -> None:
        self.model.train(mode)
        self.module.train(mode)  # the nested containers DDP's flattened model skips
        if not mode:
            self.sync_buffers()

    def sync_buffers(self) -> None:
        """Before evaluating, every rank takes rank 0's buffers (BatchNorm statistics)."""
        for buf in self.module.buffers():
            dist.broadcast(buf, src=0)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The score of this rank's slice of the test batch, times the world size
        (``reduce_metric`` averages), so the mean over ranks is the batch's count."""
        xs = torch.tensor_split(x, self.world_size)[self.rank]
        ys = torch.tensor_split(y, self.world_size)[self.rank]
        if len(xs) == 0:
            return no_correct(self.device)
        with self.autocast(self.device):
            out = self.module(xs)
        return self.score(out, ys) * self.world_size


STRATEGY = DDPStrategy
