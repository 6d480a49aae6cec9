"""``single``: one device, plain minibatch SGD. The baseline the others are measured against."""

from __future__ import annotations

import torch

from gputui.training.strategies.base import Stopwatch, Strategy


class Single(Strategy):
    """One model, one optimizer, one device."""

    name = "single"

    def setup(self) -> None:
        self.device = torch.device(self.devices[0].torch_device)
        self.model = self.build_model().to(self.device)
        # what a step calls: the flattened model (dp wraps the model instead)
        self.wrapped: torch.nn.Module = self.fast(self.lean(self.model))
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.device)
        self.watch = Stopwatch(self.device)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        start = self.watch.mark() if self.meter else None
        self.opt.zero_grad(set_to_none=True)
        loss = self.forward_backward(self.wrapped, x, y, len(x), self.device)
        self.optimizer_step(self.opt)
        if self.scaler is not None:
            self.scaler.update()
        if start is not None:
            self.timing = {"start": start, "end": self.watch.mark(), "samples": len(x)}
        return loss

    def read_timing(self) -> dict:
        """Seconds of the metered step (called at the log interval)."""
        if not self.timing:
            return {}
        t = self.watch.seconds(self.timing["start"], self.timing["end"])
        return {"step_s": t, "comm_s": None,
                "per_device": [{"device": self.devices[0].name, "samples": self.timing["samples"],
                                "compute_s": t}]}

    def eval_models(self):
        return [(self.model, self.device)]


STRATEGY = Single
