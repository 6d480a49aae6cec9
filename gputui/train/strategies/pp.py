"""``pp``: pipeline parallelism with ``torch.distributed.pipelining``, one stage per rank.

The model's top-level blocks (as ``model_parallel`` cuts them: balanced by parameter count,
or at ``strategy.split_points``) become consecutive stages, one per rank, launched like ddp
(gloo on CPU, NCCL on GPUs). Each batch is cut into ``strategy.pipeline_chunks`` equal
micro-batches that flow through the stages on ``strategy.schedule``: ``gpipe`` (every
forward, then every backward) or ``1f1b`` (after a warm-up, one forward and one backward in
turn, so a stage holds at most ``stages`` micro-batches' activations). ``optim.micro_batches``
runs that schedule once per slice, accumulating gradients.

Each micro-batch's loss is its mean times its share of the global batch, so the stages'
gradients are exactly single's. A weight shared by blocks on different stages (the GPT's head
tied to its token embedding) is kept as a copy on each of those stages, and their gradients
are summed every step before the update (Megatron's embedding group), so the copies stay
equal. The loss exists on the last stage only: ``train_step`` returns it times the world size
there and zero elsewhere, so ``reduce_metric`` (the ranks' mean) gives it on every rank, and
rank 0 records it; evaluation does the same with its counts.

What a step costs (``pp_meter``): each stage's compute, its sends and receives, and the
bubble, the time it sits idle waiting for the other stages, against the theory's
(p - 1) / (m + p - 1).
"""

from __future__ import annotations

import inspect
import itertools
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gputui.core.config import ConfigError
from gputui.core.steps import StepReport
from gputui.train.strategies.base import no_correct
from gputui.train.strategies import rank_step
from gputui.train.strategies.rank import RankStrategy
from gputui.train.strategies.model_parallel import cut_blocks, stage_blocks
from gputui.train.strategies.pp_comm import cpu_copy, recv_tensor, send_tensor
from gputui.train.strategies.pp_meter import PipeMeter, TimedStage

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


class PipelineParallel(RankStrategy):
    """This rank's stage of the model, driven by a torch pipelining schedule. Process group,
    stop agreement, metric reduction and memory rows are every rank strategy's."""

    name = "pp"
    module: nn.Module  # this rank's stage (parameter names as in the whole model)
    opt: torch.optim.Optimizer
    bounds: list[int]  # the blocks of stage s are bounds[s]:bounds[s + 1]
    stage: TimedStage  # torch's PipelineStage, marked on metered steps
    schedule: Any  # ScheduleGPipe or Schedule1F1B around ``stage``
    chunks: int  # micro-batches per schedule step (strategy.pipeline_chunks)
    # this stage's weights shared with other stages: (weight, their group, this stage is the
    # first holding it: the one that counts it in a norm over the stages)
    ties: list[tuple[nn.Parameter, Any, bool]]
    pipe: PipeMeter  # the stage's messages, pipeline span and link calibration
    _denom: float  # the global batch of the step in flight (the loss's scale)
    _whole: nn.Module | None  # the whole model on the meta device (primary_model)
    _step_kw: dict[str, Any]  # schedule.step's optional arguments this torch has
    _prefixes: dict[str, str]  # the stage's child names -> their names in the whole model

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        self.join_group()  # this rank's device, the process group, the meter
        self.module = self.cut(self.build_model().to(self.device))
        self.opt = self.make_optimizer(self.module.parameters())
        self.updater.reduce_sq = self._stages_sq
        if self.rank == 0:
            kind = "on the CPU" if not self.cuda else "one per GPU"
            self.notes.append(f"{self.world_size} {self.backend} ranks {kind}, "
                              f"{torch.get_num_threads()} thread(s) each")

    def models(self) -> list[nn.Module]:
        return [self.module]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    def cut(self, model: nn.Module) -> nn.Module:
        """Cut the whole model (built on every rank from the same seed) into stages; keep this
        rank's (parameter names as in the whole model, "3.attn.q.weight") and build its
        PipelineStage and schedule."""
        from torch.distributed import pipelining

        p, s = self.world_size, self.rank
        label = self.cfg.model.factory or self.cfg.model.name
        blocks = stage_blocks(model, label, "pp")
        cut = cut_blocks(blocks, p, self.cfg.strategy.split_points, label, "pp", "ranks")
        self.bounds, counts = cut.bounds, cut.counts
        a, b = self.bounds[s], self.bounds[s + 1]
        # the stage's children keep their index in the whole model ("3.attn.q.weight"); a
        # model that declares gputui_blocks() maps them back to its own names (_full_names)
        mine = nn.Sequential(OrderedDict((str(i), blocks[i]) for i in range(a, b)))
        where = {id(m): name for name, m in model.named_modules()}
        self._prefixes = {str(i): where.get(id(blocks[i]), str(i)) for i in range(a, b)}
        self.ties = self._tie_groups(blocks)
        self.chunks = self.cfg.strategy.pipeline_chunks
        if self.cfg.strategy.schedule == "1f1b" and self.chunks < p:  # torch's own rule
            raise ConfigError(f"strategy.schedule = '1f1b' needs strategy.pipeline_chunks of at "
                              f"least the {p} stages ({self.chunks} given); raise it or use "
                              f"strategy.schedule = 'gpipe'")
        self.pipe = PipeMeter(self.meter, s, p, self.chunks)
        self.stage = TimedStage(mine, s, p, self.device)
        self.stage.meter, self.stage.pipe = self.meter, self.pipe
        kind = getattr(pipelining, SCHEDULES[self.cfg.strategy.schedule])
        # scale_grads=False: the loss is already scaled to its share of the global batch
        self.schedule = kind(self.stage, self.chunks, loss_fn=self._loss, scale_grads=False)
        # the last stage's merged outputs are not needed (torch 2.13 can skip keeping them)
        self._step_kw = ({"return_outputs": False}
                         if "return_outputs" in inspect.signature(kind.step).parameters else {})
        self._denom = 1.0
        self._whole = None
        if s == 0:
            sizes = ", ".join(f"stage {i} blocks {lo}-{hi - 1} ({sum(counts[lo:hi]):,} params)"
                              for i, (lo, hi) in enumerate(itertools.pairwise(self.bounds)))
            self.notes.append(f"pp: {label} cut into {p} stages {cut.how} (split points "
                              f"{cut.points}): "
                              f"{sizes}; {self.chunks} micro-batch(es) per step on the "
                              f"{self.cfg.strategy.schedule} schedule; theoretical bubble "
                              f"(p-1)/(m+p-1) = {self.pipe.theory:.0%}")
            if self.ties:
                self.notes.append("pp: a weight shared across stages (the head tied to the "
                                  "embedding) is a copy on each; their gradients are summed "
                                  "every step, as Megatron's embedding group does")
        return mine

    def _tie_groups(self, blocks: list[nn.Module]) -> list[tuple[nn.Parameter, Any, bool]]:
        """Parameters held by blocks of several stages: a process group of those stages for
        each (every rank creates every group, in the same order, as new_group requires); the
        ones this rank holds, with their group and whether this is the first stage holding it."""
        where: dict[int, tuple[nn.Parameter, set[int]]] = {}
        for s, (lo, hi) in enumerate(itertools.pairwise(self.bounds)):
            for block in blocks[lo:hi]:
                for param in block.parameters():
                    where.setdefault(id(param), (param, set()))[1].add(s)
        out = []
        for param, stages in where.values():
            if len(stages) < 2:
                continue
            group = dist.new_group(sorted(stages))
            if self.rank in stages:
                out.append((param, group, self.rank == min(stages)))
        return out

    def primary_model(self) -> nn.Module:
        """The whole model, on the meta device (no memory): what stands for the run, e.g. its
        parameter count; this rank trains only ``module``, its stage."""
        if self._whole is None:
            with torch.device("meta"):
                self._whole = self.build_model()
        return self._whole

    def compiles(self) -> bool:
        """Not here: the schedule calls the stage's module itself, chunk by chunk."""
        if self.cfg.run.compile != "off" and self.rank == 0:
            self.notes.append("run.compile does not apply to pp here: the pipelining stage "
                              "runs its module eagerly")
        return False

    def no_sync(self):  # pragma: no cover - pp never calls forward_backward
        raise NotImplementedError

    # ---------------------------------------------------------------- training
    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The schedule's loss_fn (last stage): a micro-batch's mean loss times its share of
        the global batch, timed as compute."""
        with self.meter.compute:
            return self.scaled_loss(out, y, self._denom)

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        m = self.meter.begin(data_s)
        self.opt.zero_grad(set_to_none=True)
        self._denom = float(len(x))
        self.pipe.start_step(m.on)
        first, last = self.stage.is_first, self.stage.is_last
        losses: list[torch.Tensor] = []
        k = min(self.micro, len(x))
        xs: tuple[torch.Tensor, ...] = (x,)
        ys: tuple[torch.Tensor, ...] = (y,)
        if k > 1:
            xs, ys = torch.tensor_split(x, k), torch.tensor_split(y, k)
        with self.autocast(self.device):
            for xm, ym in zip(xs, ys, strict=True):
                mine: list[torch.Tensor] = []  # the schedule refills the list it is given
                self.schedule.step(*((xm,) if first else ()), target=ym if last else None,
                                   losses=mine if last else None, **self._step_kw)
                losses += mine
        # inside the pipeline's span: the sum waits for the other stage's last backward,
        # which is bubble; its own transfer is counted with the stage's messages
        self._sum_tied_grads()
        self.pipe.end_pipeline()
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(x))
        if last:
            return torch.stack([loss.detach().float() for loss in losses]).sum() * self.world_size
        return torch.zeros((), device=self.device)

    def _sum_tied_grads(self) -> None:
        """Sum the gradients of the weights shared across stages, over those stages."""
        for param, group, first in self.ties:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            self.pipe.note_tie(param.grad, first)
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)

    def _stages_sq(self, sq: torch.Tensor) -> torch.Tensor:
        """The whole model's squared gradient norm from this stage's (``sq``): summed over
        the stages, a tied weight's (summed) gradient counted once, on its first stage."""
        total = sq.detach().clone()
        for param, _, first in self.ties:
            if not first and param.grad is not None:
                total -= param.grad.detach().float().pow(2).sum().to(total.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.clamp_min(0.0)  # a subtraction's rounding must not make it negative

    # ---------------------------------------------------------------- evaluation
    def set_train(self, mode: bool) -> None:
        """Every stage switches its own module (no buffers to share: stages differ)."""
        self.module.train(mode)

    @torch.no_grad()
    def forward_only(self, x: torch.Tensor) -> torch.Tensor | None:
        """The batch through every stage (plain sends and receives, a header with the shape
        first); the output on the last stage, None on the others."""
        h = x if self.stage.is_first else recv_tensor(self.rank - 1, self.device)
        with self.autocast(self.device):
            out = self.module(h)
        if self.stage.is_last:
            return out
        send_tensor(out, self.rank + 1)
        return None

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The test batch's score (``score``: correct predictions, or summed loss per token),
        on the last stage times the world size (zero elsewhere), so ``reduce_metric``'s mean
        over ranks is the batch's."""
        out = self.forward_only(x)
        if out is None:
            return no_correct(self.device)
        return self.score(out, y) * self.world_size

    # ---------------------------------------------------------------- figures
    def step_report(self) -> StepReport:
        """Every stage's metered step, gathered (a collective: every rank calls it): a rank's
        row (``rank_step``) with the stage's compute, breakdown and pipeline figures."""
        self.pipe.calibrate()  # once: the link's transfer time, from a ping-pong
        mine = rank_step.row(self)
        if self.meter.measured:
            mine = replace(mine, **self.pipe.figures())
        rows: list[Any] = [None] * self.world_size
        dist.all_gather_object(rows, (self.node, mine), group=self.control)
        devices = tuple(r if node == self.node else replace(r, device=f"{r.device}@node{node}")
                        for node, r in rows)
        m = self.meter
        comm = mine.breakdown.comm_exposed_s if mine.breakdown is not None else None
        return StepReport(step_s=m.step_s() if m.measured else 0.0, comm_s=comm,
                          devices=devices)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The whole model's parameters (every stage's, gathered onto every rank, on the
        CPU; names as in the whole model) and every stage's optimizer state, in stage order."""
        mine = {"model": self._full_names(cpu_copy(self.module.state_dict())),
                "opt": cpu_copy(self.opt.state_dict())}
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, mine, group=self.control)
        model: dict[str, Any] = {}
        for part in parts:
            model.update(part["model"])
        return {"models": [model], "optimizers": [part["opt"] for part in parts],
                "scaler": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["optimizers"]
        if len(saved) != self.world_size:
            raise ValueError(f"{len(saved)} pipeline stage(s) saved, {self.world_size} here")
        full = state["models"][0]
        names = self._full_names(self.module.state_dict())  # whole-model name -> tensor here
        missing = [k for k in names if k not in full]
        if missing:
            raise ValueError(f"the checkpoint lacks {', '.join(missing[:3])}")
        self.module.load_state_dict(dict(zip(self.module.state_dict(), (full[k] for k in names),
                                             strict=True)))
        self.opt.load_state_dict(saved[self.rank])

    def _full_names(self, state: dict[str, Any]) -> dict[str, Any]:
        """A stage's state dict under the whole model's names (in the same order)."""
        out = {}
        for key, value in state.items():
            head, _, rest = key.partition(".")
            out[f"{self._prefixes[head]}.{rest}"] = value
        return out

    @torch.no_grad()
    def full_model(self) -> nn.Module:
        """A new plain module with every stage's parameters (a collective; tests and tools)."""
        plain = self.build_model()
        plain.load_state_dict(self.state_dict()["models"][0])
        return plain


STRATEGY = PipelineParallel
