"""A strategy's memory rows: what each device holds for training (parameters, gradients,
optimizer state, activations, the allocator's figures), for the run's memory report."""

from __future__ import annotations

import torch
from torch import nn

from gputui.core.devices import Device
from gputui.core.events import MemoryRow


def expert_bytes(model: nn.Module) -> int:
    """Bytes of the expert parameters ``model`` holds here (its MoE layers', ep's slice of
    them on an expert-parallel rank; 0 for a dense model)."""
    from gputui.train.moe import layers

    return sum(p.numel() * p.element_size() for layer in layers(model)
               for p in layer.experts.parameters())


class MemoryRows:
    """The memory figures of a strategy (mixed into ``Strategy``, whose models, optimizers and
    devices it reads)."""

    devices: list[Device]
    torch_devices: list[torch.device]

    def models(self) -> list[nn.Module]:
        raise NotImplementedError

    def optimizers(self) -> list[torch.optim.Optimizer]:
        raise NotImplementedError

    def primary_model(self) -> nn.Module:
        raise NotImplementedError

    def device_memory(self) -> dict[str, tuple[int, int]]:
        """Each CUDA device's (allocated, reserved) bytes now, by device name, for the metered
        step's rows (torch's allocator; CPU devices have none)."""
        return {d.name: (torch.cuda.memory_allocated(d.index), torch.cuda.memory_reserved(d.index))
                for d in self.devices if d.kind == "cuda"}

    def memory_groups(self) -> list[tuple[str, torch.device, nn.Module, list]]:
        """(device name, torch device, model, optimizers) for each device this process holds
        training state on: one per device when every device has its own model and optimizer
        (replicas), else everything on the first device (one model spread over several, as
        model_parallel and dp, is counted whole there)."""
        models, opts = self.models(), self.optimizers()
        if len(models) == len(opts) == len(self.devices) > 1:
            return [(d.name, dev, m, [o])
                    for d, dev, m, o in zip(self.devices, self.torch_devices, models, opts,
                                            strict=True)]
        return [(self.devices[0].name, self.torch_devices[0], self.primary_model(), opts)]

    def memory_rows(self, activations: dict[str, int] | None) -> list[MemoryRow]:
        """Every device's memory (see events.MemoryRow), gathered over the processes (a
        collective in multi-process strategies: call on every rank). ``activations``: an
        ActivationMeter's peaks by torch device, shared evenly by the virtual devices that
        share one torch device."""
        from gputui.train import memory

        groups = self.memory_groups()
        sharing: dict[str, int] = {}
        for _, dev, _, _ in groups:
            sharing[str(dev)] = sharing.get(str(dev), 0) + 1
        # selective checkpointing keeps its outputs in torch's own cache, out of the meter's
        # sight: no activation figure rather than a low one
        unseen = getattr(getattr(self, "cfg", None), "parallel", None)
        if unseen is not None and unseen.ac == "selective":
            activations = None
        rows = []
        for name, dev, model, opts in groups:
            act = activations.get(str(dev)) if activations is not None else None
            rows.append(MemoryRow(
                device=name, **memory.counted(model, opts),
                experts=expert_bytes(model),  # a mixture of experts: this rank's experts
                activations=act // sharing[str(dev)] if act is not None else None,
                **memory.allocator(dev)))
        return self.gather_rows(rows)

    def gather_rows(self, rows: list[MemoryRow]) -> list[MemoryRow]:
        """Every process's rows, in rank order (this process's alone here)."""
        return rows
