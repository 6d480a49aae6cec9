"""The plain sends and receives of pp's evaluation, and its checkpoint's CPU copies.

Evaluation runs the stages forward only, outside the pipelining schedule: each stage receives
its input from the one before (a header with its dtype and shape, then the data), runs its
blocks and sends the output on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


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
