"""The one rank strategy: a process per device, the parallelisms of its mesh applied to the model.

Every torch.distributed run (``ddp``, ``fsdp``, ``tp``, ``fsdp_tp``, ``mesh``) is this class:
the strategy's name only picks a point of the mesh (``gputui.core.mesh.mesh_of``). A step,
read top to bottom (``train_step``):

1. take this data-parallel group's slice of the global batch (``shard``: ddp's even or
   weighted split, over the ``dp = dp_replicate x dp_shard`` groups; tensor-parallel ranks of
   one group see the same slice);
2. forward and backward, the loss scaled by ``len(slice) / (batch / dp)`` so that the
   data-parallel average of the gradients (DDP's all-reduce, fully_shard's reduce-scatter) is
   exactly the full batch's; tensor parallelism's all-reduces run inside forward and backward;
   with micro-batches the data-parallel sync runs on the last only (``no_sync``);
3. the update (clipping by the global norm, the lr schedule: ``Strategy.optimizer_step``).

``setup`` joins the process group (NCCL on CUDA, gloo on the CPU, and a gloo group on the CPU
for the small control messages), builds the mesh and the model on this rank's device, and calls
``gputui.train.parallelize.parallelize`` (tp, activation checkpointing, fully_shard), then wraps
what a step calls in DDP where the mesh's data parallelism is plain replicas (ddp, and ZeRO-1).
Metrics are means over ranks of each rank's share scaled to the whole; each rank's metered step
is gathered at the log interval (``gather_steps``, at the end).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import psutil
import torch
import torch.distributed as dist
from torch import nn

from gputui.core import breakdown
from gputui.core.devices import backend_for
from gputui.core.events import DeviceStep, MemoryRow, StepReport
from gputui.core.mesh import MeshShape, mesh_of
from gputui.train import parallelize as par
from gputui.train.optim import build, optimizer_class
from gputui.train.rankinfo import RankInfo
from gputui.train.strategies.base import Strategy, no_correct
from gputui.train.strategies.comm_timer import CommTimer, SpanTimer, gbps
from gputui.train.strategies.fsdp_comm import FSDPCommTimer, install
from gputui.train.strategies.meter import Meter, merged
from gputui.train.strategies.scratch import split_sizes

if TYPE_CHECKING:
    from gputui.train.pipeline import Pipeline

STOP_CHECK_S = 0.25  # about how often the ranks agree on a stop request
STOP_CHECK_MAX = 50  # ... but at least every 50 steps


class RankStrategy(Strategy):
    """One process per device, one mesh (see the module doc)."""

    name = "ddp"  # each instance takes its config's strategy name
    local_world: int  # ranks on this machine
    node: int  # this machine's place among the machines
    device: torch.device
    cuda: bool
    backend: str  # the process group's: nccl or gloo
    _owns_group: bool  # join_group initialised the process group (close destroys it)
    control: dist.ProcessGroup | None  # gloo group of the control messages (None: the default)
    comm: SpanTimer | None  # the communication timer of the step's collectives (or None)
    shape: MeshShape  # the mesh's degrees and levers
    mesh_of_ranks: Any  # torch's DeviceMesh over every rank
    dp: int  # data-parallel groups
    dp_rank: int  # this rank's group
    tp: int  # ranks per tensor-parallel group
    module: nn.Module  # the model itself (parameter names, evaluation, checkpoints)
    model: nn.Module  # what a step calls: the module, or DDP around it (compiled, flattened)
    opt: torch.optim.Optimizer
    pipeline: Pipeline | None  # this rank's stages and schedule (pp > 1)
    cp: Any = None  # the context parallelism (gputui.train.context_parallel), or None
    _pp_group: Any  # the pp dimension's process group (None: the world)
    _denom: float  # the pipeline step's data-parallel slice (its loss's scale)
    _whole: nn.Module | None  # the whole model on the meta device (pp's primary_model)
    weights: list[float] | None  # every dp group's share of a batch (strategy.split_weights)
    _shard: dict[int, tuple[int, int]]
    _stop_countdown: int
    _stop_every: int
    _stop_t: float
    _slow_s: float  # debug.slow_backward_ms on debug.slow_rank, in seconds (else 0)
    _experts: list[nn.Parameter]  # ep > 1: this rank's expert parameters (else empty)
    _ep: Any  # ep's process groups (parallelize.EPGroups; None for a dense model)
    _expert_names: set[str]  # the expert parameters' names in self.module

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.name = self.cfg.strategy.name

    # ---------------------------------------------------------------- set-up
    def join_group(self) -> None:
        """This rank's identity, device, process groups and meter."""
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

    def setup(self) -> None:
        self.join_group()
        self._experts, self._ep, self._expert_names = [], None, set()
        shape = self.shape = mesh_of(self.cfg, self.world_size)
        mesh = self.mesh_of_ranks = par.build_mesh(self.device.type, shape)
        self.dp, self.tp = shape.dp, shape.tp
        self.dp_rank = par.dp_coordinate(mesh, shape)
        group = par.dp_group(mesh, shape)
        tp_timer = (par.TPCommTimer(self.meter, delay_s=self.comm_delay_s,
                                    count_bytes=shape.dp == 1) if shape.tp > 1 else None)
        self.comm = tp_timer
        wrap = list(self.cfg.strategy.fsdp_wrap)
        kind, args = optimizer_class(self.cfg.optim, self.lr)
        self.pipeline = None
        if shape.pp > 1:
            done = self._setup_pipeline(mesh, wrap, tp_timer)
            self.opt = build(kind, args, dict.fromkeys(self.module.parameters()))
            pipe = self.pipeline
            assert pipe is not None
            self.updater.reduce_sq = lambda sq: pipe.stages_sq(sq, self._pp_group)
            self._finish_setup(done)
            return
        self.module = self.build_model().to(self.device)
        self.cp = self._context_parallel(mesh)
        _, done = par.parallelize(self.module, mesh, shape, wrap, tp_timer, self.meter, self.cp)
        self._experts, self._ep = done["experts"], done["ep_groups"]
        ids = {id(p) for p in self._experts}
        self._expert_names = {n for n, p in self.module.named_parameters() if id(p) in ids}
        if self._experts:  # the clipping norm: every ep rank's experts, once
            self.updater.reduce_sq = self._with_experts
        if shape.data_parallel == "ddp":
            # DDP runs the flattened (and, with run.compile, compiled: torch.compile around DDP
            # breaks its graph at DDP's own forward) model; self.module is the model itself
            inner = self.fast(self.lean(self.module))
            # ep's experts: their gradients are reduced apart
            self.model = par.apply_ddp(inner, group, self.device, apart=self._experts)
            hook = CommTimer(self.meter, group=group, delay_s=self.comm_delay_s)
            cast(Any, self.model).register_comm_hook(None, hook.hook)
            self.comm = hook
        elif shape.data_parallel == "fsdp":
            self.model = self.module
            if tp_timer is not None:  # fully_shard's collectives on the same timer
                install(self.module, tp_timer)
            else:
                timer = FSDPCommTimer(self.meter, delay_s=self.comm_delay_s)
                self.comm = timer if install(self.module, timer) else None
        else:
            self.model = self.module if shape.tp > 1 else self.fast(self.lean(self.module))
        if shape.data_parallel == "ddp" and shape.dp_shard > 1:  # ZeRO-1
            shard_group = mesh["dp_shard"].get_group()
            self.opt = par.zero1_optimizer(self.module.parameters(), kind, args, shard_group)
        else:
            self.opt = build(kind, args, self.module.parameters())
        self._finish_setup(done)

    def _context_parallel(self, mesh: Any) -> Any:
        """The run's context parallelism over the mesh's cp ranks (None without it): strategy
        'cp' has it even on one rank, so its one-device run is the same program."""
        if self.shape.cp == 1 and self.name != "cp":
            return None
        from gputui.train.context_parallel import ContextParallel

        names = mesh.mesh_dim_names or ()
        cp_mesh = mesh["cp"] if "cp" in names else mesh
        return ContextParallel(cp_mesh.get_group(), self.meter, self.device, cp_mesh)

    def _finish_setup(self, done: dict[str, Any]) -> None:
        self.make_scaler(self.device, list(self.opt.param_groups))
        weights, n_local = self.cfg.strategy.split_weights, len(self.devices)
        # split_weights name the local devices; every node has the same layout
        self.weights = ([weights[r % n_local] for r in range(self.world_size)]
                        if weights and self.dp == self.world_size else None)
        self._shard = {}  # batch size -> (start, size), once
        if self.rank == 0:
            self.notes += self._describe(done)

    def _setup_pipeline(self, mesh: Any, wrap: list[str],
                        tp_timer: par.TPCommTimer | None) -> dict[str, Any]:
        """pp and its neighbours: the whole model cut into this rank's stages
        (``gputui.train.pipeline``), the other dimensions applied to each stage, then the
        stages and the schedule built over them."""
        from gputui.train.pipeline import apply_pp

        shape = self.shape
        names = list(mesh.mesh_dim_names or ())
        pp_dim = names.index("pp")
        # every pipeline of the mesh: its global ranks in pp order
        lines = mesh.mesh.movedim(pp_dim, -1).reshape(-1, shape.pp).tolist()
        pp_rank = mesh["pp"].get_local_rank()
        peers = next(line for line in lines if self.rank in line)
        self._pp_group = mesh["pp"].get_group() if shape.pp != shape.world else None
        label = self.cfg.model.factory or self.cfg.model.name
        whole = self.build_model().to(self.device)
        pipe = self.pipeline = apply_pp(whole, self.cfg, label, pp_rank, peers, lines,
                                        self.device, self.meter)
        done: dict[str, Any] = {"ac_blocks": 0, "fsdp_units": 0}
        for module in pipe.modules:  # data parallelism beside pp is fully_shard's (mesh.py)
            _, part = par.parallelize(module, mesh, shape, wrap, tp_timer, self.meter)
            done["fsdp_units"] += part["fsdp_units"]
            done["ac_blocks"] += part["ac_blocks"]
            if tp_timer is not None and shape.data_parallel == "fsdp":
                install(module, tp_timer)
        pipe.build(self._loss, self._pp_group, pipe.modules)
        self.module = pipe.modules[0] if len(pipe.modules) == 1 else nn.ModuleList(pipe.modules)
        self.model = self.module
        self._denom = 1.0
        self._whole: nn.Module | None = None
        if self.rank == 0:
            self.notes += pipe.describe(label)
        return done

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The schedule's loss_fn (last stage): a micro-batch's mean loss times its share of
        the data-parallel group's slice, timed as compute."""
        with self.meter.compute:
            return self.scaled_loss(out, y, self._denom)

    def _describe(self, done: dict[str, Any]) -> list[str]:
        """What the run says once at its start: the ranks, the mesh and what each rank holds."""
        shape = self.shape
        ranks = (f"{self.world_size} {self.backend} ranks on the CPU, "
                 f"{torch.get_num_threads()} thread(s) each" if not self.cuda
                 else f"{self.world_size} {self.backend} rank(s), one per GPU")
        out = [f"{ranks}; mesh {shape.describe()}"]
        if self.cp is not None:
            out.append(self.cp.describe() + "; its ranks average gradients with the "
                       "data-parallel ones")
        if shape.tp > 1:
            sees = "every rank sees the whole batch" if shape.dp == 1 else \
                "each tensor-parallel group sees its slice of the batch"
            out.append(f"attention heads and MLP width split over {shape.tp} ranks (q, k, v, "
                       f"fc column-wise; the projections row-wise); {sees}")
        if shape.data_parallel == "fsdp":
            hsdp = (f"HSDP: {shape.dp_replicate} replica(s) of {shape.dp_shard} shard(s), "
                    if shape.dp_replicate > 1 else "")
            what, kept = (("parameters, gradients and optimizer state",
                           "each unit's parameters gathered for its forward and again for "
                           "backward") if shape.zero >= 3 else
                          ("gradients and optimizer state (ZeRO-2)",
                           "each unit's parameters gathered once, kept from forward to "
                           "backward"))
            out.append(f"{hsdp}{what} sharded over the data-parallel ranks ({kept}): "
                       f"{done['fsdp_units']} fully_shard unit(s) and the whole model")
        elif shape.data_parallel == "ddp" and shape.dp_shard > 1:
            out.append(f"ZeRO-1: optimizer state sharded over {shape.dp_shard} ranks "
                       f"(ZeroRedundancyOptimizer), gradients all-reduced whole, each rank's "
                       f"updated parameters broadcast in the update")
        if shape.ep > 1:
            experts = self.cfg.model.moe_experts
            out.append(f"expert parallelism: {experts} experts a layer over groups of "
                       f"{shape.ep} data-parallel ranks ({experts // shape.ep} each); tokens "
                       f"dispatched to their experts and combined back by two all-to-alls a "
                       f"MoE layer, the experts' gradients summed over the "
                       f"{shape.dp // shape.ep} rank(s) holding the same experts")
        if done["ac_blocks"]:
            out.append(f"{shape.ac} activation checkpointing of {done['ac_blocks']} block(s): "
                       f"backward recomputes "
                       + ("each block's forward" if shape.ac == "full"
                          else "all but the matmuls' and attention's outputs"))
        return out

    def compiles(self) -> bool:
        """Only the model DDP wraps (or a mesh of one rank): torch.compile around fully_shard's
        and tensor parallelism's hooks traced no graph on torch 2.13 with gloo, so such a run
        says so and trains eager."""
        if self.cp is not None:
            if self.cfg.run.compile != "off" and self.rank == 0:
                self.notes.append(f"run.compile does not apply to {self.name} here: the ring's "
                                  f"sends and receives break torch.compile's graph; eager")
            return False
        if self.shape.data_parallel != "fsdp" and self.shape.tp == 1 and self.shape.pp == 1:
            return True
        if self.shape.pp > 1:
            if self.cfg.run.compile != "off" and self.rank == 0:
                self.notes.append(f"run.compile does not apply to {self.name} here: the "
                                  f"pipelining stage runs its module eagerly")
            return False
        if self.cfg.run.compile != "off" and self.rank == 0:
            self.notes.append(f"run.compile does not apply to {self.name} here: fully_shard's "
                              f"and tensor parallelism's hooks break torch.compile's graph; "
                              f"eager")
        return False

    def models(self) -> list[nn.Module]:
        return [self.module]

    def primary_model(self) -> nn.Module:
        """The whole model (with pp, on the meta device: no memory): what stands for the run,
        e.g. its parameter count; a pipeline rank trains only its stages."""
        if self.pipeline is None:
            return self.module
        if self._whole is None:
            with torch.device("meta"):
                self._whole = self.build_model()
        return self._whole

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    # ---------------------------------------------------------------- training
    def shard(self, x: torch.Tensor, y: torch.Tensor):
        """This rank's data-parallel group's slice of the global batch."""
        if self.dp == 1:
            return x, y
        cut = self._shard.get(len(x))
        if cut is None:
            sizes = split_sizes(len(x), self.dp, self.weights)
            cut = self._shard[len(x)] = (sum(sizes[:self.dp_rank]), sizes[self.dp_rank])
        lo, n = cut
        return x[lo:lo + n], y[lo:lo + n]

    def no_sync(self):
        """Context for every micro-batch but the last: accumulate without syncing."""
        if self.shape.data_parallel == "ddp":
            return cast(Any, self.model).no_sync()
        if self.shape.data_parallel == "fsdp":
            return self._fsdp_no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _fsdp_no_sync(self):
        model = cast(Any, self.model)  # fully_shard's module
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        m = self.meter.begin(data_s)  # the comm timers mark while the meter is on
        xs, ys = self.shard(x, y)
        self.opt.zero_grad(set_to_none=True)
        if self.pipeline is not None:
            return self._pipeline_step(m, xs, ys, len(x))
        with m.compute:  # the collectives run inside forward and backward
            if self.cp is not None:  # this rank's part of every sequence (context_parallel)
                with self.cp.step(xs, ys) as (xc, yc):
                    loss = self.forward_backward(self.model, xc, yc, len(x) / self.dp,
                                                 self.device, before_last=self.no_sync)
            else:
                loss = self.forward_backward(self.model, xs, ys, len(x) / self.dp,
                                             self.device, before_last=self.no_sync)
        if self._experts:
            self._reduce_experts()
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(xs))
        return loss

    def _reduce_experts(self) -> None:
        """ep: each expert's gradient holds the tokens of this rank's ep group; summed over
        the ranks holding the same experts and divided by the data-parallel groups, it is
        the full batch's (the average DDP takes of the other parameters). One flat
        all-reduce, named on metered steps."""
        from gputui.train.moe import reduce_expert_grads

        reduce_expert_grads(self._experts, self.dp, self._ep.replicas, self.meter)

    def _with_experts(self, sq: torch.Tensor) -> torch.Tensor:
        """The squared gradient norm with every ep rank's experts (``sq`` counted this rank's
        own and the rest, the same on every rank)."""
        mine = torch.stack([p.grad.detach().float().pow(2).sum() for p in self._experts
                            if p.grad is not None]).sum().to(sq.device)
        every = mine.clone()
        dist.all_reduce(every, group=self._ep.ep)
        return sq - mine.to(sq.dtype) + every.to(sq.dtype)

    def _pipeline_step(self, m: Any, xs: torch.Tensor, ys: torch.Tensor,
                       total: int) -> torch.Tensor:
        """The slice through the pipeline's schedule (its stages mark their compute); the
        last stage's loss times pp (the mean over every rank is then the batch's), zero on
        the others."""
        assert self.pipeline is not None
        self._denom = total / self.dp
        with self.autocast(self.device):
            losses = self.pipeline.step(xs, ys, self.micro)
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(xs))
        if self.pipeline.has_last:
            return torch.stack([loss.detach().float() for loss in losses]).sum() * self.shape.pp
        return torch.zeros((), device=self.device)

    def _pass(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, denom: float,
              device: torch.device) -> torch.Tensor:
        """The shared forward/backward, with the forward marked on metered steps (the rank's
        own phases, ``step_row``) and, under debug.slow_rank, a slower backward."""
        with self.meter.forward:
            loss = self.forward_loss(model, x, y, denom, device)
        self.backward(_SlowBackward.apply(loss, self._slow_s) if self._slow_s else loss)
        return loss.detach()

    def data_device(self) -> torch.device:
        return self.device

    # ---------------------------------------------------------------- evaluation
    def set_train(self, mode: bool) -> None:
        self.model.train(mode)
        self.module.train(mode)  # the nested containers DDP's flattened model skips
        if not mode:
            if self.pipeline is None:  # a pipeline's stages differ: no buffers to share
                for buf in self.module.buffers():  # rank 0's BatchNorm statistics everywhere
                    dist.broadcast(buf, src=0)
        elif self.shape.data_parallel == "fsdp":
            # the root's parameters stay gathered after a forward without backward
            from torch.distributed.fsdp import FSDPModule

            for module in self.module.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The score of this data-parallel group's slice of the test batch, times dp
        (``reduce_metric`` averages over the ranks). A sharded model's forward is a
        collective: a group whose slice is empty still runs one (on one example, counted
        nowhere); DDP's evaluates the module itself, alone."""
        xs = torch.tensor_split(x, self.dp)[self.dp_rank]
        ys = torch.tensor_split(y, self.dp)[self.dp_rank]
        if self.pipeline is not None:  # the last stage's score, times pp x dp
            out = self.pipeline.forward_only(xs if len(xs) else x[:1], self.autocast(self.device))
            if out is None or len(xs) == 0:
                return no_correct(self.device)
            return self.score(out, ys) * self.shape.pp * self.dp
        # the MoE layers gather their token counts (a collective) on every forward
        alone = (self.shape.data_parallel != "fsdp" and self.shape.tp == 1
                 and not (self.cfg.model.moe_experts and self.world_size > 1))
        with self.autocast(self.device):
            if len(xs) == 0:
                if not alone:
                    self.module(x[:1])
                return no_correct(self.device)
            out = self.module(xs)
        return self.score(out, ys) * self.dp

    # ---------------------------------------------------------------- checkpoints
    def _sharded(self) -> bool:
        """The parameters are DTensors (fully_shard, tp): their state is gathered whole."""
        return self.shape.data_parallel == "fsdp" or self.shape.tp > 1

    def _writers(self) -> list[int]:
        """The ranks that write a checkpoint: every machine's first."""
        return list(range(0, self.world_size, self.local_world))

    def state_dict(self) -> dict[str, Any]:
        if self.pipeline is not None:
            return self._pipeline_state()
        state = self._state()
        if self._experts:  # ep: every rank's experts, whole, as single keeps them
            self._whole_experts(state["models"][0], state["optimizers"][0])
        return state

    def _expert_entries(self) -> list[tuple[str, int, nn.Parameter]]:
        """(name, place in the optimizer, parameter) of each expert parameter, in one order
        on every rank."""
        ids = {id(p) for p in self._experts}
        out = [(n, i, p) for i, (n, p) in enumerate(self.module.named_parameters())
               if id(p) in ids]
        return sorted(out, key=lambda e: e[0])

    def _gathered(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's slice of an expert tensor (dim 0) with its ep group's, whole, on the CPU
        (a collective over the group)."""
        parts = [torch.empty_like(t) for _ in range(self.shape.ep)]
        dist.all_gather(parts, t.detach().contiguous(), group=self._ep.ep)
        return torch.cat(parts).cpu()

    def _whole_experts(self, model: dict[str, Any], optim: dict[str, Any] | None) -> None:
        """Replace the expert entries of a model and an optimizer state dict (this rank's
        slices) with the whole tensors; every rank gathers, whatever its dicts hold."""
        states = (optim or {}).get("state", {})
        for name, index, p in self._expert_entries():
            whole = self._gathered(p)
            if name in model:
                model[name] = whole
            mine = self.opt.state.get(p, {})
            # the optimizer's state_dict shares its entries with the live state: a copy
            at = name if name in states else index
            entry = dict(states[at]) if at in states else None
            for key in sorted(k for k, v in mine.items()
                              if isinstance(v, torch.Tensor) and v.dim() > 0):
                value = self._gathered(mine[key])
                if entry is not None:
                    entry[key] = value
            if entry is not None:
                states[at] = entry

    def _sliced_experts(self, state: dict[str, Any]) -> dict[str, Any]:
        """A whole-model state (``state_dict``'s) with this rank's slices of the experts."""
        lo, n = self._ep.ep_rank, self.shape.ep
        model = dict(state["models"][0])
        optim = dict(state["optimizers"][0])
        states = dict(optim.get("state", {}))

        def mine(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                return t
            size = t.shape[0] // n
            return t[lo * size:(lo + 1) * size].clone()

        for name, index, _ in self._expert_entries():
            if name in model:
                model[name] = mine(model[name])
            key = name if name in states else index
            if key in states:
                states[key] = {k: mine(v) for k, v in states[key].items()}
        optim["state"] = states
        return {**state, "models": [model], "optimizers": [optim]}

    def _pipeline_state(self) -> dict[str, Any]:
        """The whole model's parameters (every stage's, gathered onto every rank, on the CPU;
        names as in the whole model) and every pipeline rank's optimizer state, in pp order
        (one pipeline's: the data-parallel and tensor-parallel copies are the same)."""
        assert self.pipeline is not None
        pipe = self.pipeline
        if self._sharded():
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions, get_model_state_dict, get_optimizer_state_dict)

            # gathered whole on every rank of the stage (cpu_offload would keep it on global
            # rank 0 alone, and each stage's lead needs its own), then moved to the CPU
            full = StateDictOptions(full_state_dict=True)
            model: dict[str, Any] = {}
            for module in pipe.modules:
                model.update(pipe.full_names(_to_cpu(get_model_state_dict(module, options=full))))
            optim = _to_cpu(get_optimizer_state_dict(self.module, self.opt, options=full))
        else:
            model = pipe.plain_state()
            optim = _to_cpu(self.opt.state_dict())
        # one copy per stage travels: the data- and tensor-parallel copies are the same
        lead = self.dp_rank == 0 and self.mesh_coordinate("tp") == 0
        mine = ({"model": model, "opt": optim, "pp": pipe.pp_rank, "lead": True} if lead
                else {"model": {}, "opt": None, "pp": pipe.pp_rank, "lead": False})
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, mine, group=self.control)
        whole: dict[str, Any] = {}
        for part in parts:
            whole.update(part["model"])
        opts = [p["opt"] for p in sorted((p for p in parts if p["lead"]), key=lambda p: p["pp"])]
        return {"models": [whole], "optimizers": opts, "scaler": None}

    def mesh_coordinate(self, dim: str) -> int:
        """This rank's place along the mesh dimension ``dim`` (0 where the mesh has none)."""
        names = list(self.mesh_of_ranks.mesh_dim_names or ())
        coord = self.mesh_of_ranks.get_coordinate() or [0] * len(names)
        return int(coord[names.index(dim)]) if dim in names else 0

    def _load_pipeline_state(self, state: dict[str, Any]) -> None:
        assert self.pipeline is not None
        pipe, saved = self.pipeline, state["optimizers"]
        if len(saved) != pipe.pp:
            raise ValueError(f"{len(saved)} pipeline stage(s) saved, {pipe.pp} here")
        full = state["models"][0]
        for module in pipe.modules:
            names = pipe.full_names(module.state_dict())  # whole-model name -> tensor here
            missing = [k for k in names if k not in full]
            if missing:
                raise ValueError(f"the checkpoint lacks {', '.join(missing[:3])}")
            mine = dict(zip(module.state_dict(), (full[k] for k in names), strict=True))
            if self._sharded():
                from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                                     set_model_state_dict)

                set_model_state_dict(module, mine,
                                     options=StateDictOptions(full_state_dict=True))
            else:
                module.load_state_dict(mine)
        if self._sharded():
            from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                                 set_optimizer_state_dict)

            set_optimizer_state_dict(self.module, self.opt, saved[pipe.pp_rank],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.opt.load_state_dict(saved[pipe.pp_rank])

    def _state(self) -> dict[str, Any]:
        """Full (unsharded) model and optimizer state, gathered for the checkpoint only, onto
        the CPU: on one machine onto rank 0 alone (the only writer); across machines every
        node's first rank writes its own copy, so every rank gathers. ZeRO-1's sharded
        optimizer state is consolidated on each writing rank."""
        if self._sharded():
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            rank0_only = self.local_world == self.world_size
            model, optim = get_state_dict(self.module, self.opt, options=StateDictOptions(
                full_state_dict=True, cpu_offload=rank0_only))
            if not rank0_only:
                model, optim = _to_cpu(model), _to_cpu(optim)
            return {"models": [model], "optimizers": [optim], "scaler": self.scaler_state()}
        consolidate = getattr(self.opt, "consolidate_state_dict", None)
        if consolidate is None:
            return super().state_dict()
        # each shard group consolidates onto its own writers, named by their rank in the
        # group (ZeroRedundancyOptimizer's ``to``); the groups are disjoint
        group = self.mesh_of_ranks["dp_shard"].get_group()
        members = dist.get_process_group_ranks(group)
        for writer in self._writers():
            if writer in members:
                consolidate(to=dist.get_group_rank(group, writer))
        optim = self.opt.state_dict() if self.rank in self._writers() else {}
        return {"models": [self.module.state_dict()], "optimizers": [optim],
                "scaler": self.scaler_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.pipeline is not None:
            self._load_pipeline_state(state)
            return
        if self._experts:
            state = self._sliced_experts(state)
        if not self._sharded():
            super().load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.module, self.opt, model_state_dict=state["models"][0],
                       optim_state_dict=state["optimizers"][0],
                       options=StateDictOptions(full_state_dict=True))
        self.load_scaler_state(state)

    @torch.no_grad()
    def full_model(self) -> nn.Module:
        """A new plain module holding the full parameters, gathered now (a collective: call on
        every rank; for tests and tools, training never keeps one)."""
        full: dict[str, Any] = self.module.state_dict()
        if self.pipeline is not None:
            full = self.state_dict()["models"][0]
        elif self._sharded():
            from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                                 get_model_state_dict)

            full = get_model_state_dict(self.module,
                                        options=StateDictOptions(full_state_dict=True))
        if self._experts:
            full = dict(full)
            self._whole_experts(full, None)
        plain = self.build_model()
        plain.load_state_dict({k: v.cpu() if isinstance(v, torch.Tensor) else v
                               for k, v in full.items()})
        return plain

    # ---------------------------------------------------------------- the ranks together
    def step_report(self) -> StepReport | None:
        """Every rank's metered step, gathered (a collective, on every rank); a pipeline
        rank's row carries its stage's compute, breakdown and pipeline figures."""
        if self.pipeline is None:
            return gather_steps(self)
        pipe = self.pipeline.pipe
        pipe.calibrate()  # once: the link's transfer time, from a ping-pong
        mine = step_row(self)
        if self.meter.measured:
            mine = replace(mine, **pipe.figures())
        rows: list[Any] = [None] * self.world_size
        dist.all_gather_object(rows, (self.node, mine), group=self.control)
        devices = tuple(r if node == self.node else replace(r, device=f"{r.device}@node{node}")
                        for node, r in rows)
        m = self.meter
        comm = mine.breakdown.comm_exposed_s if mine.breakdown is not None else None
        return StepReport(step_s=m.step_s() if m.measured else 0.0, comm_s=comm,
                          devices=devices)

    def agree_stop(self, mine: int) -> int:
        """Non-zero when any rank wants to stop (``mine``: this rank's reason code, 0 for none;
        the largest code asked, ``stopping.reason_code``). The ranks agree with a small MAX
        all-reduce, not at every step (that sync point costs a few % of throughput on fast
        steps) but every k-th check, k agreed in the same all-reduce (the smallest of the
        ranks' proposals) so that a check happens about every STOP_CHECK_S: every rank makes
        the same checks, so all stop at the same step. A stop asked between checks waits for
        the next one."""
        self._stop_countdown -= 1
        if self._stop_countdown > 0:
            return 0
        now = time.perf_counter()
        step_s = (now - self._stop_t) / max(1, self._stop_every)
        self._stop_t = now
        proposal = max(1, min(STOP_CHECK_MAX, int(STOP_CHECK_S / max(step_s, 1e-6))))
        flag = torch.tensor([float(mine), -float(proposal)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control)
        code, every = flag.tolist()  # one read of the agreed pair
        self._stop_every = self._stop_countdown = int(-every)
        return int(code)

    def reduce_metric(self, value: torch.Tensor) -> torch.Tensor:
        """Mean over ranks of each rank's whole-scaled share: the global figure."""
        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.world_size

    def memory_groups(self) -> list[tuple[str, torch.device, nn.Module, list]]:
        name = self.devices[self.local_rank].name
        if self.node:
            name = f"{name}@node{self.node}"
        # ZeRO-1 keeps its partition's state in the local optimizer it wraps
        opts = [getattr(o, "optim", o) for o in self.optimizers()]
        return [(name, self.device, self.models()[0], opts)]

    def gather_rows(self, rows: list[MemoryRow]) -> list[MemoryRow]:
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


def _to_cpu(value: Any) -> Any:
    """A state dict with every tensor moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


# ---------------------------------------------------------------------------------------
# What one rank of a multi-process strategy (ddp, fsdp) reports of its metered step, and
# the gathering of every rank's report at the log interval.
#
# Each rank turns its meter into a :class:`~gputui.core.events.DeviceStep`: its samples, its
# compute and whole step, the breakdown (its collectives split out of compute by the strategy's
# communication timer, see ``comm_timer``), its memory and process, and the collectives it
# timed. The rows travel whole over the control group (gloo, on the CPU) in one
# ``all_gather_object``, once per log interval; each is named from the receiving rank's side
# (another machine's device gets ``@node<k>``).


def gather_steps(strategy: RankStrategy) -> StepReport:
    """Every rank's metered step, in rank order (a collective: call on every rank); the
    report's step and comm seconds are this rank's."""
    m, timer = strategy.meter, strategy.comm
    rows: list[Any] = [None] * strategy.world_size
    dist.all_gather_object(rows, (strategy.node, step_row(strategy)), group=strategy.control)
    here = strategy.node
    devices = tuple(r if node == here else replace(r, device=f"{r.device}@node{node}")
                    for node, r in rows)
    comm = m.comm.busy(m.start) if m.measured and timer is not None else None
    return StepReport(step_s=m.step_s() if m.measured else 0.0, comm_s=comm, devices=devices)


def step_row(strategy: RankStrategy) -> DeviceStep:
    """This rank's metered step (samples and seconds 0 before its first)."""
    m, timer = strategy.meter, strategy.comm
    out = DeviceStep(strategy.devices[strategy.local_rank].name, rank=strategy.rank,
                     pid=os.getpid(), rss=_rss(), compute_s=0.0, step_time_s=0.0)
    if strategy.cuda:
        out = replace(out, mem_alloc=torch.cuda.memory_allocated(strategy.device),
                      mem_reserved=torch.cuda.memory_reserved(strategy.device))
    if not m.measured:
        return out
    bd = step_breakdown(m, timer)
    forward = own_forward(m)
    out = replace(out, recompute_s=m.recompute.seconds() if m.recompute.marks else None,
                  samples=m.samples, compute_s=m.until(m.compute_end()),
                  step_time_s=m.step_s(), breakdown=bd, forward_s=forward,
                  backward_s=None if forward is None else max(0.0, bd.compute_s - forward))
    if timer is not None and m.comm.marks:  # the collectives it timed
        comm_s = m.comm.busy(m.start)
        out = replace(out, comm_s=comm_s, comm_calls=len(m.comm.marks),
                      collectives=m.collectives(), collective_bytes=m.kind_bytes or None)
        if m.comm_bytes:  # ddp's gradient all-reduce: its bandwidth
            out = replace(out, comm_bytes=m.comm_bytes, comm_gbps=gbps(m.comm_bytes, comm_s))
    return out


def step_breakdown(m: Meter, timer: SpanTimer | None) -> breakdown.Breakdown:
    """The rank's breakdown: compute up to where the timer says backward's compute ended
    (ddp: the last bucket's launch), exposed comm from there to the end of backward, the
    rest of the all-reduce time hidden. Where the timer cannot split the step (fsdp on GPUs,
    a torch without fsdp's custom collectives) comm stays in compute (None); a step that
    synced nothing has 0."""
    step, (begin, backward_end) = m.step_s(), m.compute.marks[-1]
    cut = timer.split() if timer is not None else None
    if cut is None:
        exposed = overlap = None if timer is None or not timer.splits else 0.0
        compute = m.clock.seconds(begin, backward_end)
    else:
        compute_end, exposed, overlap = cut
        compute = compute_end - m.until(begin)
    return breakdown.make(step, m.data_s, compute, m.optimizer.seconds(), exposed, overlap)


def own_forward(m: Meter) -> float | None:
    """The rank's forward passes, less the collectives that ran inside them (fsdp's
    all-gathers): its own forward work (None where no forward was marked)."""
    if not m.forward.marks:
        return None
    spans = m.forward.intervals(m.start)
    comm = m.comm.intervals(m.start)
    inside = [(max(a, c), min(b, d)) for a, b in spans for c, d in comm if min(b, d) > max(a, c)]
    return max(0.0, merged(spans) - merged(inside))


@functools.cache
def _process() -> Any:
    return psutil.Process()


def _rss() -> int | None:
    try:
        return int(_process().memory_info().rss)
    except Exception:  # noqa: BLE001 - a figure, not a reason to fail
        return None


STRATEGY = RankStrategy
