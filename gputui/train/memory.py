"""Each device's own training memory: parameters, gradients, optimizer state, activations.

The first three are counted from the tensors themselves (their bytes on this device: a
sharded parameter, gradient or optimizer state counts its local shard only), which works on
any device. Activations are what autograd keeps for backward: on one step the loop runs under
:class:`ActivationMeter` (``torch.autograd.graph.saved_tensors_hooks``), which adds up the
storages saved during forward, drops each when autograd frees it, and keeps the peak, so
micro-batches (each freed by its own backward) are not added together. On CUDA the
allocator's own figures (allocated now, peak since the epoch began, reserved) come with them.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

PARTS = ("params", "grads", "optim", "activations")


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor on this process's device: a DTensor's local shard only."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _sum(tensors: Iterable[torch.Tensor]) -> int:
    total, seen = 0, set()
    for t in tensors:
        key = (t.data_ptr(), t.numel(), t.dtype) if not hasattr(t, "to_local") else id(t)
        if key in seen:  # a tied weight, or a tensor listed twice
            continue
        seen.add(key)
        total += tensor_bytes(t)
    return total


def _state_tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _state_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _state_tensors(v)


def counted(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int]:
    """{"params", "grads", "optim"}: bytes of the model's parameters, of their gradients that
    exist now, and of the optimizers' state (momentum buffers, Adam's moments and steps)."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    state = [t for opt in optimizers for s in opt.state.values() for t in _state_tensors(s)]
    return {"params": _sum(params), "grads": _sum(grads), "optim": _sum(state)}


class _Saved:
    """What the pack hook returns in place of a saved tensor; its end is the tensor's release."""

    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter: "ActivationMeter", key: tuple, tensor: torch.Tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        self.meter._release(self.key)


class ActivationMeter:
    """Context: the peak bytes of the tensors autograd saves for backward, per device type
    and index (``peak[str(device)]``). Parameters (and views of them) are not activations
    and are not counted; a storage saved several times counts once."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._refs: dict[tuple, list] = {}  # storage key -> [references, bytes, device]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> "ActivationMeter":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor) -> Any:
        base = t._base if t._base is not None else t
        if (base.is_leaf and base.requires_grad) or isinstance(base, nn.Parameter) \
                or t.device.type == "meta":
            return t
        # a DTensor (tensor parallelism) holds its shard: that is what this device saves
        local = getattr(t, "_local_tensor", t)
        try:
            storage = local.untyped_storage()
            key = (storage.data_ptr(), str(t.device))
        except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
            return t
        ref = self._refs.get(key)
        if ref is None:
            ref = self._refs[key] = [0, storage.nbytes(), str(t.device)]
            dev = ref[2]
            self.live[dev] = self.live.get(dev, 0) + ref[1]
            self.peak[dev] = max(self.peak.get(dev, 0), self.live[dev])
        ref[0] += 1
        return _Saved(self, key, t)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key: tuple) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] <= 0:
            del self._refs[key]
            self.live[ref[2]] -= ref[1]


def allocator(device: torch.device) -> dict[str, int]:
    """CUDA's allocator figures for ``device`` (allocated now, peak since the last reset,
    reserved); {} on other devices, where no allocator reports."""
    if device.type != "cuda":
        return {}
    return {"alloc": torch.cuda.memory_allocated(device),
            "peak": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device)}


def reset_peak(devices: Iterable[torch.device]) -> None:
    """Start a new peak window (the loop calls this at each epoch's start)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
