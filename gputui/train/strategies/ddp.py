"""``ddp``: DistributedDataParallel, one process per device, launched by torch's elastic agent.

Each rank (see ``gputui.train.ranks``) walks the same global batches ``single`` sees and
takes its shard (even, or by ``split_weights``). Its loss is summed and divided by the global
batch over the world size, so DDP's gradient averaging yields exactly the full-batch gradient,
even for uneven shards. With micro-batches, DDP's gradient sync runs on the last one only
(``no_sync``). NCCL on CUDA, gloo on CPU; every collective has ``strategy.timeout_s``. Small
control messages (the agreed stop, the per-rank figures) go over gloo on the CPU even for an
NCCL job, so they never wait on the GPU stream.

Metrics are combined as means over ranks: each rank reports its share scaled to the whole
(share x world size), so ``reduce_metric`` (sum / world size) gives the global figure.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from gputui.core import breakdown
from gputui.train.rankinfo import RankInfo
from gputui.train.strategies.base import Stopwatch, Strategy, no_correct
from gputui.train.strategies.comm_timer import CommTimer, gbps
from gputui.train.strategies.fsdp_comm import FSDPCommTimer
from gputui.train.strategies.scratch import split_sizes

STOP_CHECK_S = 0.25  # about how often the ranks agree on a stop request
STOP_CHECK_MAX = 50  # ... but at least every 50 steps
# the per-rank figures gathered at the log interval, in this order (float64)
_FIELDS = ("rank", "node", "cuda", "index", "samples", "compute_s", "step_s", "mem_alloc",
           "mem_reserved", "rss", "pid", "comm_bytes", "comm_s", "comm_calls")
# the rank's step breakdown (gputui.core.breakdown), gathered after _FIELDS; -1 = not measured
_PARTS = ("step_s", "data_s", "compute_s", "comm_exposed_s", "comm_overlap_s", "optimizer_s",
          "wait_s", "host_s")


def backend_for(requested: str, device_kind: str) -> str:
    """The process-group backend: "auto" is nccl on CUDA devices, gloo on CPU ones."""
    if requested != "auto":
        return requested
    return "nccl" if device_kind == "cuda" else "gloo"


class DDPStrategy(Strategy):
    """The model wrapped in DistributedDataParallel on this rank's device."""

    name = "ddp"
    local_world: int  # ranks on this machine
    node: int  # this machine's place among the machines
    device: torch.device
    cuda: bool
    backend: str  # the process group's: nccl or gloo
    _owns_group: bool  # setup initialised the process group (close destroys it)
    control: dist.ProcessGroup | None  # gloo group of the control messages (None: the default)
    watch: Stopwatch
    comm: CommTimer | FSDPCommTimer | None  # the comm hook's timer, or fsdp's collectives'
    module: nn.Module
    model: nn.Module  # what a step calls: the module wrapped (ddp) or sharded (fsdp)
    opt: torch.optim.Optimizer
    weights: list[float] | None  # every rank's share of a batch (strategy.split_weights)
    _shard: dict[int, tuple[int, int]]
    _rss: Any  # psutil.Process, made on first use
    _stop_countdown: int
    _stop_every: int
    _stop_t: float

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        n_local = len(self.devices)
        me = RankInfo.of_process(n_local, self.rank, self.world_size)  # this rank's identity
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
        self.watch = Stopwatch(self.device)
        self.comm = None  # set by wrap() (fsdp: its FSDPCommTimer, or None)
        self.module = self.build_model().to(self.device)  # parameter names, eval, checkpoints
        self.model = self.wrap(self.module)
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.device)
        weights = self.cfg.strategy.split_weights
        # split_weights name the local devices; every node has the same layout
        self.weights = [weights[r % n_local] for r in range(self.world_size)] if weights else None
        self._shard: dict[int, tuple[int, int]] = {}  # batch size -> (start, size), once
        self._rss = None
        self._stop_countdown = self._stop_every = 1  # see agree_stop
        self._stop_t = time.perf_counter()
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
        self.comm = CommTimer(self.watch, delay_s=self.comm_delay_s)
        ddp.register_comm_hook(None, self.comm.hook)
        return ddp

    def no_sync(self):
        """Context for every micro-batch but the last: accumulate without all-reducing."""
        from torch.nn.parallel import DistributedDataParallel

        return cast(DistributedDataParallel, self.model).no_sync()  # what wrap made

    def models(self) -> list[nn.Module]:
        return [self.module]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    def data_device(self) -> torch.device:
        return self.device

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
        start = self.watch.mark() if data_s is not None else None
        total = len(x)
        xs, ys = self.shard(x, y)
        self.opt.zero_grad(set_to_none=True)
        if self.comm is not None:
            self.comm.start_step(start is not None)
        begin = self.watch.mark() if start is not None else None
        # / (total / world): DDP divides the summed gradients by the world size again
        loss = self.forward_backward(self.model, xs, ys, total / self.world_size, self.device,
                                     before_last=self.no_sync)
        backward_end = self.watch.mark() if start is not None else None
        if self.comm is not None:
            self.comm.active = False  # the step's collectives are done: evaluation is not marked
        self.optimizer_step(self.opt)
        if start is not None:
            self.timing = {"start": start, "begin": begin, "backward_end": backward_end,
                           "end": self.watch.mark(), "samples": len(xs), "data_s": data_s}
        return loss

    def step_breakdown(self) -> dict:
        """This rank's breakdown of the metered step (see CommTimer.split): compute up to the
        last bucket's launch, exposed comm from there to the end of backward. fsdp's timer
        (fsdp_comm.FSDPCommTimer) splits its collectives out the same way on the CPU; on GPUs,
        and where torch cannot time them, they stay in compute (exposed 0 or None)."""
        t, w = self.timing, self.watch
        span = w.seconds(t["start"], t["end"])
        begin = w.seconds(t["start"], t["begin"])
        backward = w.seconds(t["start"], t["backward_end"])
        split = self.comm.split(t["start"], t["backward_end"]) if self.comm is not None else None
        if split is None:  # nothing synced (0), or comm that cannot be split here (None)
            unsplit = self.comm is None or not self.comm.splits
            exposed = overlap = None if unsplit else 0.0
            compute = backward - begin
        else:
            compute_end, exposed, overlap = split
            compute = compute_end - begin
        return breakdown.make(span, t["data_s"], compute, span - backward, exposed, overlap)

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

    # ---------------------------------------------------------------- figures
    def read_timing(self) -> dict:
        """Every rank's figures of the metered step, gathered (a collective, on every rank)."""
        t = self.timing
        step = self.watch.seconds(t["start"], t["end"]) if t else 0.0
        compute = self.watch.seconds(t["start"], t["backward_end"]) if t else 0.0
        alloc = reserved = -1.0
        if self.cuda:
            alloc = float(torch.cuda.memory_allocated(self.device))
            reserved = float(torch.cuda.memory_reserved(self.device))
        dev = self.devices[self.local_rank]
        bd = self.step_breakdown() if t else {}
        parts = [-1.0 if bd.get(k) is None else bd[k] for k in _PARTS]
        timer = self.comm if t else None
        comm = timer.seconds(t["start"]) if timer is not None else None
        nbytes = timer.nbytes if timer is not None else 0
        mine = torch.tensor([self.rank, self.node, float(self.cuda), dev.index,
                             t.get("samples", 0) if t else 0, compute, step, alloc, reserved,
                             self._read_rss(), os.getpid(), nbytes,
                             -1.0 if comm is None else comm,
                             len(timer.spans) if timer is not None else 0, *parts],
                            dtype=torch.float64)
        rows = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(rows, mine, group=self.control)
        per_device = [self._row(dict(zip(_FIELDS, r[:len(_FIELDS)].tolist(), strict=True)),
                                r[len(_FIELDS):].tolist())
                      for r in rows]
        return {"step_s": step, "comm_s": comm, "per_device": per_device}

    def _row(self, f: dict, parts: list[float]) -> dict:
        name = f"{'cuda' if f['cuda'] else 'cpu'}:{int(f['index'])}"
        if int(f["node"]) != self.node:  # another machine's device: say which
            name = f"{name}@node{int(f['node'])}"
        row = {"device": name, "rank": int(f["rank"]), "pid": int(f["pid"]),
               "samples": int(f["samples"]), "compute_s": f["compute_s"],
               "step_time_s": f["step_s"]}
        if f["mem_alloc"] >= 0:
            row.update(mem_alloc=int(f["mem_alloc"]), mem_reserved=int(f["mem_reserved"]))
        if f["rss"] >= 0:
            row["rss"] = int(f["rss"])
        if f["comm_s"] >= 0 and f["comm_calls"] > 0:  # the collectives it timed
            row.update(comm_s=f["comm_s"], comm_calls=int(f["comm_calls"]))
            if f["comm_bytes"] > 0:  # ddp's gradient all-reduce: its bandwidth
                row.update(comm_bytes=int(f["comm_bytes"]),
                           comm_gbps=gbps(int(f["comm_bytes"]), f["comm_s"]))
        if parts[0] >= 0:
            row["breakdown"] = {k: (None if v < 0 else v)
                                for k, v in zip(_PARTS, parts, strict=True)}
        return row

    def _read_rss(self) -> float:
        try:
            import psutil

            self._rss = self._rss or psutil.Process()
            return float(self._rss.memory_info().rss)
        except Exception:  # noqa: BLE001 - a figure, not a reason to fail
            return -1.0

    def memory_groups(self):
        name = self.devices[self.local_rank].name
        if self.node:
            name = f"{name}@node{self.node}"
        return [(name, self.device, self.module, [self.opt])]

    def gather_rows(self, rows: list[dict]) -> list[dict]:
        """Every rank's rows, in rank order (a collective over the control group)."""
        out: list = [None] * self.world_size
        dist.all_gather_object(out, rows, group=self.control)
        return [row for part in out for row in part]

    def device_stats(self) -> list[dict]:
        return []  # the gathered rows carry memory; querying other GPUs would touch them

    def close(self) -> None:
        """Barrier, then destroy the process group (ranks.py does it again in ``finally``)."""
        if self._owns_group and dist.is_initialized():
            dist.barrier(group=self.control)
            destroy_group()


def destroy_group() -> None:
    """destroy_process_group, without the deadlock it can hit on gloo: its destructor joins
    gloo's worker threads while holding the GIL, and a worker that is still releasing a
    finished collective's tensors needs the GIL for that. Sleeping first hands it over."""
    import time

    time.sleep(0.1)
    dist.destroy_process_group()


STRATEGY = DDPStrategy
