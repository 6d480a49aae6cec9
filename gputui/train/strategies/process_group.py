"""What every strategy with one process per device shares (ddp, fsdp, and the next ones): the
process group, the agreed stop, metrics reduced over the ranks, every rank's rows gathered.

``join_group()`` (from a subclass's ``setup``) finds this rank's identity and device, starts
the process group (NCCL on CUDA, gloo on CPU, ``strategy.timeout_s`` on every collective)
and a gloo group on the CPU for the small control messages (the agreed stop, the per-rank
figures), so they never wait on the GPU stream; it makes the meter on the rank's device.
The subclass then builds its model, sets ``comm`` (its communication timer, or None) and
writes ``train_step``; ``step_report`` gathers every rank's metered step (``rank_step``).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from gputui.core.steps import StepReport
from gputui.train.rankinfo import RankInfo
from gputui.train.strategies import rank_step
from gputui.train.strategies.base import Strategy
from gputui.core.devices import backend_for
from gputui.train.strategies.comm_timer import SpanTimer
from gputui.train.strategies.meter import Meter

STOP_CHECK_S = 0.25  # about how often the ranks agree on a stop request
STOP_CHECK_MAX = 50  # ... but at least every 50 steps


class RankStrategy(Strategy):
    """One process per device, in one process group (see the module doc)."""

    local_world: int  # ranks on this machine
    node: int  # this machine's place among the machines
    device: torch.device
    cuda: bool
    backend: str  # the process group's: nccl or gloo
    _owns_group: bool  # join_group initialised the process group (close destroys it)
    control: dist.ProcessGroup | None  # gloo group of the control messages (None: the default)
    comm: SpanTimer | None  # the communication timer the subclass installs (or None)
    _stop_countdown: int
    _stop_every: int
    _stop_t: float
    _slow_s: float  # debug.slow_backward_ms on debug.slow_rank, in seconds (else 0)

    def join_group(self) -> None:
        """This rank's identity, device, process groups and meter (see the module doc)."""
        me = RankInfo.of_process(len(self.devices), self.rank, self.world_size)
        self.local_rank, self.local_world = me.local_rank, me.local_world_size
        dev = self.devices[self.local_rank]
        self.device = self.torch_devices[self.local_rank]
        self.cuda = dev.kind == "cuda"
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.backend = backend_for(self.cfg.strategy.backend, dev.kind)
        timeout = timedelta(seconds=self.cfg.strategy.timeout_s)
        self._owns_group = not dist.is_initialized()
        if self._owns_group:  # a test may have set the group up already
            dist.init_process_group(self.backend, timeout=timeout)
        self.rank, self.world_size, self.node = me.rank, me.world_size, me.node
        # control messages over gloo on the CPU; for a gloo job that is the default group
        self.control = (dist.new_group(backend="gloo", timeout=timeout)
                        if self.backend != "gloo" else None)
        self.meter = Meter([self.device])
        self.comm = None
        dbg = self.cfg.debug  # a straggler on purpose (tests): this rank's backward slowed
        self._slow_s = dbg.slow_backward_ms / 1000.0 if dbg.slow_rank == self.rank else 0.0
        self._stop_countdown = self._stop_every = 1  # see agree_stop
        self._stop_t = time.perf_counter()

    def _pass(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, denom: float,
              device: torch.device) -> torch.Tensor:
        """The shared forward/backward, with the forward marked on metered steps (the rank's
        own phases, ``rank_step``) and, under debug.slow_rank, a slower backward."""
        with self.meter.forward:
            loss = self.forward_loss(model, x, y, denom, device)
        self.backward(_SlowBackward.apply(loss, self._slow_s) if self._slow_s else loss)
        return loss.detach()

    def data_device(self) -> torch.device:
        return self.device

    def step_report(self) -> StepReport | None:
        """Every rank's metered step, gathered (a collective, on every rank)."""
        return rank_step.gather(self)

    def agree_stop(self, mine: bool) -> bool:
        """True when any rank wants to stop. The ranks agree with a small MAX all-reduce, not
        at every step (that sync point costs a few % of throughput on fast steps) but every
        k-th check, k agreed in the same all-reduce (the smallest of the ranks' proposals)
        so that a check happens about every STOP_CHECK_S: every rank makes the same checks,
        so all stop at the same step. A stop asked between checks waits for the next one."""
        self._stop_countdown -= 1
        if self._stop_countdown > 0:
            return False
        now = time.perf_counter()
        step_s = (now - self._stop_t) / max(1, self._stop_every)
        self._stop_t = now
        proposal = max(1, min(STOP_CHECK_MAX, int(STOP_CHECK_S / max(step_s, 1e-6))))
        flag = torch.tensor([1.0 if mine else 0.0, -float(proposal)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control)
        self._stop_every = self._stop_countdown = int(-flag[1].item())
        return bool(flag[0].item())

    def reduce_metric(self, value: torch.Tensor) -> torch.Tensor:
        """Mean over ranks of each rank's whole-scaled share: the global figure."""
        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.world_size

    def memory_groups(self) -> list[tuple[str, torch.device, nn.Module, list]]:
        name = self.devices[self.local_rank].name
        if self.node:
            name = f"{name}@node{self.node}"
        return [(name, self.device, self.models()[0], self.optimizers())]

    def gather_rows(self, rows: list[dict]) -> list[dict]:
        """Every rank's rows, in rank order (a collective over the control group)."""
        out: list = [None] * self.world_size
        dist.all_gather_object(out, rows, group=self.control)
        return [row for part in out for row in part]

    def device_memory(self) -> dict[str, tuple[int, int]]:
        return {}  # the gathered rows carry memory; querying other GPUs would touch them

    def close(self) -> None:
        """Barrier, then destroy the process group (ranks.py does it again in ``finally``)."""
        if self._owns_group and dist.is_initialized():
            dist.barrier(group=self.control)
            destroy_group()


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward sleeps first (debug.slow_backward_ms): every gradient of
    the step comes that much later, as on a rank whose backward is slow."""

    @staticmethod
    def forward(ctx, loss, seconds):  # noqa: ANN001 - autograd's signature
        ctx.seconds = seconds
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        time.sleep(ctx.seconds)
        return grad, None


def destroy_group() -> None:
    """destroy_process_group, without the deadlock it can hit on gloo: its destructor joins
    gloo's worker threads while holding the GIL, and a worker that is still releasing a
    finished collective's tensors needs the GIL for that. Sleeping first hands it over."""
    time.sleep(0.1)
    dist.destroy_process_group()

