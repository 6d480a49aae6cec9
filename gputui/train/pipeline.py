"""Pipeline parallelism as a function of a model and the mesh's ``pp`` dimension
(``torch.distributed.pipelining``): :func:`apply_pp` cuts the model into stages, keeps this
rank's and returns a :class:`Pipeline` that runs a batch through them on the configured
schedule.

The model's top-level blocks (as ``model_parallel`` cuts them: balanced by parameter count, or
at ``strategy.split_points``) become ``pp x v`` consecutive stages: one per rank for GPipe and
1F1B; ``v = strategy.stages_per_rank`` for the looped schedules (interleaved 1F1B, looped BFS,
interleaved zero bubble: rank r holds stages r, r + pp, ...), two in a V for ZB-V and
DualPipe-V (rank r holds stages r and 2 pp - 1 - r). A schedule this torch lacks is refused
with the ones it has. Each data-parallel group's slice of a batch is cut into
``strategy.pipeline_chunks`` micro-batches that flow through the stages.

Each micro-batch's loss is its mean times its share of the group's slice, so the stages'
gradients are exactly single's (the data-parallel average making the whole batch's). A weight
shared by blocks on stages of different ranks (the GPT's head tied to its token embedding) is a
copy on each, and their gradients are summed every step before the update (Megatron's
embedding group); on one rank (the V schedules put the first and last stage together) it is one
parameter. The loss exists on the last stage only.

The other dimensions apply to the stages as to a whole model (``gputui.train.parallelize``):
tensor parallelism to their blocks, fully_shard over the data-parallel ranks (HSDP for plain
replicas: DDP does not take a pipeline's several forwards before a backward).
"""

from __future__ import annotations

import inspect
import itertools
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from gputui.core.config import ConfigError, RunConfig
from gputui.core.mesh import PP_PLACEMENT, ZERO_BUBBLE, stages_per_rank
from gputui.train.strategies.meter import Meter
from gputui.train.strategies.model_parallel import cut_blocks, stage_blocks
from gputui.train.strategies.pp_meter import PipeMeter, TimedStage

# strategy.schedule -> torch's class (core.mesh.PP_PLACEMENT: how many stages a rank holds)
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved_1f1b": "ScheduleInterleaved1F1B", "looped_bfs": "ScheduleLoopedBFS",
             "interleaved_zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
             "dualpipev": "ScheduleDualPipeV"}


def available() -> list[str]:
    """The schedules this torch has, in SCHEDULES' order."""
    from torch.distributed import pipelining

    return [name for name, cls in SCHEDULES.items()
            if hasattr(pipelining, cls) or hasattr(pipelining.schedules, cls)]


def stage_ids(schedule: str, pp_rank: int, pp: int, v: int) -> list[int]:
    """The stages rank ``pp_rank`` of ``pp`` holds: looped (r, r + pp, ...) or a V."""
    if PP_PLACEMENT[schedule] == "V":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(v)]


class Pipeline:
    """This rank's stages and the schedule that drives them (see the module doc). ``peers``
    are the global ranks of this rank's pipeline, in pp order."""

    def __init__(self, cfg: RunConfig, model: nn.Module, label: str, pp_rank: int,
                 peers: list[int], lines: list[list[int]], device: torch.device, meter: Meter):
        pp = len(peers)
        self.cfg, self.pp_rank, self.pp, self.peers, self.device = cfg, pp_rank, pp, peers, device
        self.schedule_name = cfg.strategy.schedule
        if self.schedule_name not in available():
            raise ConfigError(f"strategy.schedule = {self.schedule_name!r} is not in this torch "
                              f"({torch.__version__}); it has {', '.join(available())}")
        self.v = stages_per_rank(self.schedule_name, cfg.strategy.stages_per_rank)
        n_stages = pp * self.v
        blocks = stage_blocks(model, label, "pp")
        cut = cut_blocks(blocks, n_stages, cfg.strategy.split_points, label, "pp",
                         "stages (ranks x stages per rank)")
        self.bounds, self.cut = cut.bounds, cut
        self.ids = stage_ids(self.schedule_name, pp_rank, pp, self.v)
        self.owner = {s: r for r in range(pp)
                      for s in stage_ids(self.schedule_name, r, pp, self.v)}
        where = {id(m): name for name, m in model.named_modules()}
        # a stage's children keep their index in the whole model ("3.attn.q.weight"); a model
        # that declares gputui_blocks() maps them back to its own names (full_names)
        self.modules: list[nn.Module] = []
        self.prefixes: dict[str, str] = {}
        for s in self.ids:
            a, b = self.bounds[s], self.bounds[s + 1]
            self.modules.append(nn.Sequential(OrderedDict((str(i), blocks[i])
                                                          for i in range(a, b))))
            self.prefixes.update({str(i): where.get(id(blocks[i]), str(i)) for i in range(a, b)})
        self.ties = self._tie_groups(blocks, lines)
        self.chunks = cfg.strategy.pipeline_chunks
        self.pipe = PipeMeter(meter, pp_rank, pp, self.chunks, peers=peers, per_rank=self.v,
                              zero_bubble=self.schedule_name in ZERO_BUBBLE)
        self.meter = meter
        self.loss_fn: Callable | None = None
        self.schedule: Any = None
        self.stages: list[TimedStage] = []

    # ---------------------------------------------------------------- set-up
    def _tie_groups(self, blocks: list[nn.Module],
                    lines: list[list[int]]) -> list[tuple[tuple[int, str], Any, bool]]:
        """Parameters held by stages on different ranks of a pipeline: a process group of
        those ranks for each, in every pipeline of the mesh (``lines``: each one's global
        ranks in pp order; every rank creates every group, in the same order, as new_group
        requires); the ones this rank holds, with their group and whether this rank is the
        first holding it."""
        where: dict[int, tuple[nn.Parameter, set[int]]] = {}
        for s, (lo, hi) in enumerate(itertools.pairwise(self.bounds)):
            for block in blocks[lo:hi]:
                for param in block.parameters():
                    where.setdefault(id(param), (param, set()))[1].add(self.owner[s])
        # a tied weight is found again by its name in this rank's stages: fully_shard and tp
        # replace the Parameter objects, not their names
        names = {id(p): (i, name) for i, module in enumerate(self.modules)
                 for name, p in module.named_parameters(remove_duplicate=False)}
        out = []
        me = dist.get_rank()
        for param, owners in where.values():
            if len(owners) < 2:
                continue
            for line in lines:
                ranks = sorted(line[r] for r in owners)
                group = dist.new_group(ranks)
                if me in ranks:
                    out.append((names[id(param)], group, me == ranks[0]))
        return out

    def tied(self) -> list[tuple[nn.Parameter, Any, bool]]:
        """The tied weights this rank holds, as its stages hold them now (sharded or not),
        with their group and whether this rank is the first holding each."""
        return [(self.modules[i].get_parameter(name), group, first)
                for (i, name), group, first in self.ties]

    def build(self, loss_fn: Callable, group, run: list[nn.Module]) -> None:
        """The PipelineStages over what each stage runs (``run``: its module, parallelized)
        and the schedule; ``group``: the pp dimension's process group (None: the world)."""
        from torch.distributed import pipelining

        n_stages = self.pp * self.v
        self.loss_fn = loss_fn
        for s, module in zip(self.ids, run, strict=True):
            stage = TimedStage(module, s, n_stages, self.device, group=group)
            stage.meter, stage.pipe = self.meter, self.pipe
            self.stages.append(stage)
        cls_name = SCHEDULES[self.schedule_name]
        kind = getattr(pipelining, cls_name, None) or getattr(pipelining.schedules, cls_name)
        single = PP_PLACEMENT[self.schedule_name] == 1
        # scale_grads=False: the loss is already scaled to its share of the global batch
        self.schedule = kind(self.stages[0] if single else self.stages, self.chunks,
                             loss_fn=loss_fn, scale_grads=False)
        # the last stage's merged outputs are not needed (torch 2.13 can skip keeping them)
        self._step_kw = ({"return_outputs": False}
                         if "return_outputs" in inspect.signature(kind.step).parameters else {})

    @property
    def has_first(self) -> bool:
        return 0 in self.ids

    @property
    def has_last(self) -> bool:
        return self.pp * self.v - 1 in self.ids

    def describe(self, label: str) -> list[str]:
        """The run's notes: the cut, the schedule, the bubble the theory expects."""
        counts = self.cut.counts
        sizes = ", ".join(f"stage {i} {self.cut.units(lo, hi)}: {sum(counts[lo:hi]):,} params"
                          for i, (lo, hi) in enumerate(itertools.pairwise(self.bounds)))
        t = self.pipe.theory
        bubble = (f"theoretical bubble (p-1)/(v m+p-1) = {t:.0%}" if t is not None else
                  "a zero-bubble schedule: weight gradients fill the bubble")
        placed = "" if self.v == 1 else f", {self.v} stages per rank"
        out = [f"pp: {label} cut into {len(self.bounds) - 1} stages {self.cut.how} (split "
               f"points {self.cut.points}): {sizes}; {self.chunks} micro-batch(es) per step on "
               f"the {self.schedule_name} schedule{placed}; {bubble}"]
        if self.ties:
            out.append("pp: a weight shared across stages (the head tied to the embedding) is a "
                       "copy on each; their gradients are summed every step, as Megatron's "
                       "embedding group does")
        return out

    # ---------------------------------------------------------------- a step
    def step(self, x: torch.Tensor, y: torch.Tensor, micro: int) -> list[torch.Tensor]:
        """The batch slice through the schedule (``micro`` slices, accumulating), then the
        tied weights' gradients summed; the last stage's micro-batch losses."""
        self.pipe.start_step(self.meter.on)
        losses: list[torch.Tensor] = []
        k = min(micro, len(x))
        xs: tuple[torch.Tensor, ...] = (x,)
        ys: tuple[torch.Tensor, ...] = (y,)
        if k > 1:
            xs, ys = torch.tensor_split(x, k), torch.tensor_split(y, k)
        first, last = self.has_first, self.has_last
        for xm, ym in zip(xs, ys, strict=True):
            mine: list[torch.Tensor] = []  # the schedule refills the list it is given
            self.schedule.step(*((xm,) if first else ()), target=ym if last else None,
                               losses=mine if last else None, **self._step_kw)
            losses += mine
        # inside the pipeline's span: the sum waits for the other stage's last backward,
        # which is bubble; its own transfer is counted with the stage's messages
        self.sum_tied_grads()
        self.pipe.end_pipeline()
        return losses

    def sum_tied_grads(self) -> None:
        """Sum the gradients of the weights shared across ranks, over those ranks."""
        for param, group, first in self.tied():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad = param.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            self.pipe.note_tie(local, first)
            dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)

    def stages_sq(self, sq: torch.Tensor, group) -> torch.Tensor:
        """The whole model's squared gradient norm from this rank's stages' (``sq``): summed
        over the pipeline (``group``), a tied weight's (summed) gradient counted once."""
        total = sq.detach().clone()
        for param, _, first in self.tied():
            if not first and param.grad is not None:
                part = param.grad.detach().float().pow(2).sum()
                whole = getattr(part, "full_tensor", None)
                total -= (whole() if whole is not None else part).to(total.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        return total.clamp_min(0.0)  # a subtraction's rounding must not make it negative

    @torch.no_grad()
    def forward_only(self, x: torch.Tensor, autocast) -> torch.Tensor | None:
        """The batch through every stage in order (plain sends and receives between ranks, a
        header with the shape first); the output where the last stage is, else None."""
        n = self.pp * self.v
        h: torch.Tensor | None = None
        for s in range(n):
            owner = self.owner[s]
            if owner != self.pp_rank:
                continue
            if s == 0:
                h = x
            elif self.owner[s - 1] != self.pp_rank:
                h = recv_tensor(self.peers[self.owner[s - 1]], self.device)
            with autocast:
                h = self.modules[self.ids.index(s)](h)
            if s == n - 1:
                return h
            if self.owner[s + 1] != self.pp_rank:
                assert h is not None
                send_tensor(h, self.peers[self.owner[s + 1]])
        return None

    # ---------------------------------------------------------------- names
    def full_names(self, state: dict[str, Any]) -> dict[str, Any]:
        """A stage's state dict under the whole model's names (in the same order)."""
        out = {}
        for key, value in state.items():
            head, _, rest = key.partition(".")
            out[f"{self.prefixes[head]}.{rest}"] = value
        return out

    def plain_state(self) -> dict[str, Any]:
        """Every local stage's tensors under the whole model's names, on the CPU."""
        out: dict[str, Any] = {}
        for module in self.modules:
            out.update(self.full_names(cpu_copy(module.state_dict())))
        return out


def apply_pp(model: nn.Module, cfg: RunConfig, label: str, pp_rank: int, peers: list[int],
             lines: list[list[int]], device: torch.device, meter: Meter) -> Pipeline:
    """Cut ``model`` (built whole on every rank, from the same seed) into the schedule's
    stages and keep this rank's: the :class:`Pipeline` whose ``modules`` the other
    parallelisms then apply to, and whose ``build`` makes the stages and the schedule."""
    return Pipeline(cfg, model, label, pp_rank, peers, lines, device, meter)


# ---------------------------------------------------------------------------------------
# The plain sends and receives of pp's evaluation, and its checkpoint's CPU copies.
# Evaluation runs the stages forward only, outside the pipelining schedule: each stage
# receives its input from the one before (a header with its dtype and shape, then the data),
# runs its blocks and sends the output on.

def cpu_copy(value: Any) -> Any:
    """A state dict (nested dicts, lists, tensors) with every tensor on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v) for v in value)
    return value


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64)
_HEADER = 9  # dtype, number of dimensions, up to 7 sizes


def send_tensor(t: torch.Tensor, dst: int) -> None:
    """Send a tensor of any shape: a header (dtype and shape), then the data."""
    if t.dim() > _HEADER - 2:
        raise ValueError(f"cannot send a {t.dim()}-dimensional activation between stages")
    head = torch.zeros(_HEADER, dtype=torch.int64)
    head[0], head[1] = _DTYPES.index(t.dtype), t.dim()
    head[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    dist.send(head.to(t.device), dst)
    dist.send(t.contiguous(), dst)


def recv_tensor(src: int, device: torch.device) -> torch.Tensor:
    """Receive what ``send_tensor`` sent."""
    head = torch.zeros(_HEADER, dtype=torch.int64, device=device)
    dist.recv(head, src)
    head = head.cpu()
    shape = head[2:2 + int(head[1])].tolist()
    out = torch.empty(shape, dtype=_DTYPES[int(head[0])], device=device)
    dist.recv(out, src)
    return out
