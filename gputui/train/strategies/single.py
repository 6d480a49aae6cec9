"""``single``: one device, plain minibatch SGD. The baseline the others are measured against."""

from __future__ import annotations

import torch

from gputui.train.parallelize import apply_ac
from gputui.train.strategies.base import Strategy
from gputui.train.strategies.meter import Meter


class Single(Strategy):
    """One model, one optimizer, one device."""

    name = "single"
    device: torch.device
    model: torch.nn.Module
    wrapped: torch.nn.Module  # what a step calls: the flattened model (dp wraps the model)
    opt: torch.optim.Optimizer

    def setup(self) -> None:
        self.device = self.torch_devices[0]
        self.model = self.build_model().to(self.device)
        self.meter = Meter([self.device])
        ac = self.cfg.parallel.ac  # activation checkpointing: the baseline of its memory
        if apply_ac(self.model, ac, list(self.cfg.strategy.fsdp_wrap), self.meter):
            self.notes.append(f"{ac} activation checkpointing of each block")
        self.wrapped = self.fast(self.lean(self.model))
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.device)

    def models(self) -> list[torch.nn.Module]:
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        m = self.meter.begin(data_s)
        self.opt.zero_grad(set_to_none=True)
        with m.compute:
            loss = self.forward_backward(self.wrapped, x, y, len(x), self.device)
        with m.optimizer:
            self.optimizer_step(self.opt)
        m.finish(samples=len(x))
        return loss


STRATEGY = Single
