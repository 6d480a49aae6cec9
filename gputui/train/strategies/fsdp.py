"""``fsdp``: fully sharded data parallelism (``torch.distributed.fsdp.fully_shard``, FSDP2).

Launched, sharded and scaled exactly like ``ddp`` (this class holds only what differs): each
rank keeps a 1/world slice of every parameter, gradient and optimizer state; a layer's full
parameters are all-gathered for its forward and backward, and gradients are reduce-scattered
(averaged, like DDP, so the same loss scaling gives the full-batch gradient). No rank keeps a
full copy: evaluation runs the sharded model itself (its forward all-gathers one layer at a
time, as in training), and a checkpoint gathers the full state with torch's distributed
state-dict API only while it is written, onto the CPU of the rank that writes it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from gputui.core.config import ConfigError
from gputui.train.strategies.base import no_correct
from gputui.train.strategies.ddp import DDPStrategy
from gputui.train.strategies.fsdp_comm import FSDPCommTimer, install
from gputui.train.strategies.meter import Meter

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


class FSDPStrategy(DDPStrategy):
    """Every layer with parameters, and the whole model, wrapped in ``fully_shard``, which
    shards the module in place: ``model`` and ``module`` are one object here, so ddp's
    evaluation, buffer broadcast and memory rows serve fsdp as they are."""

    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The mesh names the ranks' device type: without one, fully_shard takes a CUDA mesh
        # whenever CUDA is available, so CPU ranks on a GPU machine would put their shards on
        # the GPU and hang gloo's collectives.
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        names = list(self.cfg.strategy.fsdp_wrap)
        targets = wrap_targets(model, names)
        for layer in targets:
            fully_shard(layer, mesh=mesh)  # one all-gather per layer: one layer wide
        fully_shard(model, mesh=mesh)
        self.comm = timed_collectives(model, self.meter, self.comm_delay_s)
        which = f"the {', '.join(names)} modules" if names else "each top-level block"
        self.notes.append(f"parameters, gradients and optimizer state sharded over the ranks: "
                          f"{len(targets)} fully_shard unit(s), {which}, and the whole model")
        return model

    def compiles(self) -> bool:
        """Not here: torch.compile around fully_shard's model (whole, or layer by layer before
        sharding) traced no graph on torch 2.13 with gloo, the sharding hooks breaking it, so
        an fsdp run says so and trains eager."""
        if self.cfg.run.compile != "off" and self.rank == 0:
            self.notes.append("run.compile does not apply to fsdp here: fully_shard's hooks "
                              "break torch.compile's graph; eager")
        return False

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate unsharded gradients without reduce-scattering (FSDP2's no_sync)."""
        model = cast("FSDPModule", self.model)  # what wrap made: fully_shard's module
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    @torch.no_grad()
    def full_model(self) -> nn.Module:
        """A new plain module holding the full parameters, gathered now (a collective: call on
        every rank; for tests and tools, training never keeps one)."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict)

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        plain = self.build_model()
        plain.load_state_dict({k: v.cpu() if isinstance(v, torch.Tensor) else v
                               for k, v in full.items()})
        return plain

    def set_train(self, mode: bool) -> None:
        super().set_train(mode)
        if mode:
            self._reshard()  # the root's parameters stay gathered after a forward without backward

    def _reshard(self) -> None:
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """As ddp's, on the sharded model; a rank whose slice is empty still runs a forward
        (on one example, counted nowhere), because every forward is a collective."""
        xs = torch.tensor_split(x, self.world_size)[self.rank]
        if len(xs) == 0:
            with self.autocast(self.device):
                self.model(x[:1])
            return no_correct(self.device)
        return super().evaluate(x, y)

    def state_dict(self) -> dict[str, Any]:
        """Full (unsharded) model and optimizer state, gathered for the checkpoint only, onto
        the CPU: on one machine onto rank 0 alone (the only writer); across machines every
        node's first rank writes its own copy, so every rank gathers."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        rank0_only = self.local_world == self.world_size
        model, optim = get_state_dict(self.model, self.opt, options=StateDictOptions(
            full_state_dict=True, cpu_offload=rank0_only))
        if not rank0_only:
            model, optim = _to_cpu(model), _to_cpu(optim)
        return {"models": [model], "optimizers": [optim], "scaler": self.scaler_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.model, self.opt, model_state_dict=state["models"][0],
                       optim_state_dict=state["optimizers"][0],
                       options=StateDictOptions(full_state_dict=True))
        self.load_scaler_state(state)


def timed_collectives(model: nn.Module, meter: Meter, delay_s: float) -> FSDPCommTimer | None:
    """fully_shard's all-gathers and reduce-scatters, timed on metered steps (and delayed
    under debug.comm_delay_s); None where this torch cannot swap them (comm stays in compute)."""
    timer = FSDPCommTimer(meter, delay_s=delay_s)
    return timer if install(model, timer) else None


def _to_cpu(value: Any) -> Any:
    """A state dict with every tensor moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def wrap_targets(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules that get their own fully_shard, innermost first (FSDP2 shards bottom-up):
    those whose class name is in ``names`` (strategy.fsdp_wrap), or with no names every
    top-level block that holds parameters of its own: a block sharing a parameter with
    another (a head tied to the embedding) is left to the root's unit, since one parameter
    cannot be sharded by two units. A name no module has is a ConfigError."""
    if not names:
        blocks = [m for m in model.children() if any(True for _ in m.parameters())]
        owners: dict[int, int] = {}
        for i, block in enumerate(blocks):
            for p in block.parameters():
                owners.setdefault(id(p), i)
        shared = {i for i, block in enumerate(blocks)
                  for p in block.parameters() if owners[id(p)] != i}
        shared |= {owners[id(p)] for i in shared for p in blocks[i].parameters()}
        return [b for i, b in enumerate(blocks) if i not in shared]
    found = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    seen = {type(m).__name__ for m in found}
    unknown = [n for n in names if n not in seen]
    if unknown:
        classes = sorted({type(m).__name__ for m in model.modules() if m is not model})
        raise ConfigError(f"strategy.fsdp_wrap names {', '.join(unknown)}, which no module of "
                          f"the model is; its module classes: {', '.join(classes)}")
    return found[::-1]  # modules() lists parents before children


STRATEGY = FSDPStrategy
