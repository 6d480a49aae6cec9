"""``single``: one device, plain minibatch SGD. The baseline the others are measured against."""

from __future__ import annotations

import torch

from gputui.core import breakdown
from gputui.train.strategies.base import Stopwatch, Strategy


class Single(Strategy):
    """One model, one optimizer, one device."""

    name = "single"
    device: torch.device
    model: torch.nn.Module
    wrapped: torch.nn.Module  # what a step calls: the flattened model (dp wraps the model)
    opt: torch.optim.Optimizer
    watch: Stopwatch

    def setup(self) -> None:
        self.device = self.torch_devices[0]
        self.model = self.build_model().to(self.device)
        self.wrapped = self.fast(self.lean(self.model))
        self.opt = self.make_optimizer(self.model.parameters())
        self.make_scaler(self.device)
        self.watch = Stopwatch(self.device)

    def models(self) -> list[torch.nn.Module]:
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   data_s: float | None = None) -> torch.Tensor:
        if data_s is None:
            self.opt.zero_grad(set_to_none=True)
            loss = self.forward_backward(self.wrapped, x, y, len(x), self.device)
            self.optimizer_step(self.opt)
            return loss
        w = self.watch
        start = w.mark()
        self.opt.zero_grad(set_to_none=True)
        begin = w.mark()
        loss = self.forward_backward(self.wrapped, x, y, len(x), self.device)
        backward_end = w.mark()
        self.optimizer_step(self.opt)
        self.timing = {"start": start, "begin": begin, "backward_end": backward_end,
                       "end": w.mark(), "samples": len(x), "data_s": data_s}
        return loss

    def step_breakdown(self) -> tuple[float, dict]:
        """(step seconds, breakdown) of the metered step: no communication of its own."""
        t, w = self.timing, self.watch
        span = w.seconds(t["start"], t["end"])
        return span, breakdown.make(span, t["data_s"], w.seconds(t["begin"], t["backward_end"]),
                                    w.seconds(t["backward_end"], t["end"]),
                                    comm_exposed_s=self.comm_in_compute(),
                                    comm_overlap_s=self.comm_in_compute())

    def comm_in_compute(self) -> float | None:
        """0.0: a single device communicates nothing (dp on GPUs: None, not split out)."""
        return 0.0

    def read_timing(self) -> dict:
        """Seconds of the metered step (called at the log interval)."""
        if not self.timing:
            return {}
        t, bd = self.step_breakdown()
        return {"step_s": t, "comm_s": None,
                "per_device": [{"device": self.devices[0].name, "samples": self.timing["samples"],
                                "compute_s": t, "breakdown": bd}]}


STRATEGY = Single
