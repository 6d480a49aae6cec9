"""``fsdp``: fully sharded data parallelism (``torch.distributed.fsdp.fully_shard``, FSDP2).

Launched, sharded and scaled exactly like ``ddp`` (this class holds only what differs): each
rank keeps a 1/world slice of every parameter, gradient and optimizer state; a layer's full
parameters are all-gathered for its forward and backward, and gradients are reduce-scattered
(averaged, like DDP, so the same loss scaling gives the full-batch gradient). Evaluation and
checkpoints use the full parameters, gathered with ``DTensor.full_tensor()``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
from torch import nn

from gputui.config import ConfigError
from gputui.training.strategies.ddp import DDPStrategy


class FSDPStrategy(DDPStrategy):
    """Every layer with parameters, and the whole model, wrapped in ``fully_shard``."""

    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The mesh names the ranks' device type: without one, fully_shard takes a CUDA mesh
        # whenever CUDA is available, so CPU ranks on a GPU machine would put their shards on
        # the GPU and hang gloo's collectives.
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        self._plain = copy.deepcopy(model)  # a full, unsharded copy for eval and checkpoints
        names = list(self.cfg.strategy.fsdp_wrap)
        targets = wrap_targets(model, names)
        for layer in targets:
            fully_shard(layer, mesh=mesh)  # one all-gather per layer: one layer wide
        fully_shard(model, mesh=mesh)
        which = f"the {', '.join(names)} modules" if names else "each top-level block"
        self.notes.append(f"parameters, gradients and optimizer state sharded over the ranks: "
                          f"{len(targets)} fully_shard unit(s), {which}, and the whole model")
        return model

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate unsharded gradients without reduce-scattering (FSDP2's no_sync)."""
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def local_module(self) -> nn.Module:
        return self.model

    @torch.no_grad()
    def full_model(self) -> nn.Module:
        """A plain module holding the full parameters (a collective: call on every rank)."""
        for (name, p), q in zip(self.model.named_parameters(), self._plain.parameters()):
            q.copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)
        for b, q in zip(self.model.buffers(), self._plain.buffers()):
            q.copy_(b)
        return self._plain

    def set_train(self, mode: bool) -> None:
        self.model.train(mode)
        self._plain.train(mode)
        if not mode:
            self.sync_buffers()
            self.full_model()  # the evaluation forward runs on the gathered copy

    def sync_buffers(self) -> None:
        for buf in self.model.buffers():
            torch.distributed.broadcast(buf, src=0)

    def eval_module(self) -> nn.Module:
        return self._plain

    def eval_models(self):
        return [(self.model, self.device)]

    def state_dict(self) -> dict[str, Any]:
        """Full (unsharded) model and optimizer state, gathered on every rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model, optim = get_state_dict(self.model, self.opt,
                                      options=StateDictOptions(full_state_dict=True))
        return {"models": [model], "optimizers": [optim], "scaler":
                self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.model, self.opt, model_state_dict=state["models"][0],
                       optim_state_dict=state["optimizers"][0],
                       options=StateDictOptions(full_state_dict=True))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def wrap_targets(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules that get their own fully_shard, innermost first (FSDP2 shards bottom-up):
    those whose class name is in ``names`` (strategy.fsdp_wrap), or with no names every
    top-level block that holds parameters. A name no module has is a ConfigError."""
    if not names:
        return [m for m in model.children() if any(True for _ in m.parameters())]
    found = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    seen = {type(m).__name__ for m in found}
    unknown = [n for n in names if n not in seen]
    if unknown:
        classes = sorted({type(m).__name__ for m in model.modules() if m is not model})
        raise ConfigError(f"strategy.fsdp_wrap names {', '.join(unknown)}, which no module of "
                          f"the model is; its module classes: {', '.join(classes)}")
    return found[::-1]  # modules() lists parents before children


STRATEGY = FSDPStrategy
