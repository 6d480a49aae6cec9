"""Tensor parallelism of the built-in GPT, and fsdp x tp on a 2-D mesh, as functions of a
model and a device mesh (torchtitan's ``parallelize_llama``, picotron's one file per idea).

:func:`parallelize_gpt` shards every block Megatron-style with
``torch.distributed.tensor.parallel``: q, k, v and the MLP's first layer column-wise (each rank
computes its heads and its quarter-width slice of the MLP), the attention and MLP output
projections row-wise (each rank's partial sum all-reduced). Each block's attention and MLP take
their input as one replicated DTensor (``PrepareModuleInput``), so the gradients of q, k and v
meet there and backward all-reduces once per sub-layer, not once per linear. Per block, a step
therefore runs 4 all-reduces of a ``batch x context x n_embd`` activation: 2 in forward (the
row-wise outputs), 2 in backward (the inputs' gradients). The layers keep local tensors
between them (``use_local_output``): attention runs ``scaled_dot_product_attention`` on plain
tensors of this rank's heads (a DTensor there fails on the CPU). Embeddings, norms and the
tied head stay replicated: every rank sees the same batch and computes the same values and
gradients for them.

:func:`fsdp_tp` puts that inside a ``(dp, tp)`` mesh and shards the tp-sharded blocks again
over ``dp`` with ``fully_shard`` (FSDP2 takes the DTensor parameters as they are).

:class:`TPCommTimer` marks those all-reduces on metered steps with module hooks around the
ones torch registers (forward: the row-wise layers' outputs; backward: an identity autograd
node on each side of the input's redistribution), in the shape the ddp strategy's breakdown
reads (``meter.comm``, :mod:`~gputui.train.strategies.meter`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from gputui.train.strategies.fsdp_comm import FSDPCommTimer
from gputui.train.strategies.meter import Meter

# the linears tensor parallelism shards in each block, and how (GPT's module names)
COLWISE = ("attn.q", "attn.k", "attn.v", "mlp.fc")
ROWWISE = ("attn.proj", "mlp.proj")
INPUTS = ("attn", "mlp")  # sub-layers whose input is replicated once for their colwise linears


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a GPT (``gpt.Block``), in order."""
    from gputui.train.gpt import Block

    return [m for m in model.children() if isinstance(m, Block)]


def why_not_tp(model: nn.Module, tp: int) -> str | None:
    """None when ``model`` can be split over ``tp`` ranks, else the reason (one line)."""
    found = blocks(model)
    if not found:
        return "tensor parallelism needs the built-in GPT (model.name = 'gpt'): its blocks' " \
               "q, k, v and MLP layers are what it shards"
    attn: Any = found[0].attn
    heads = attn.q.out_features // attn.head_dim
    if heads % tp:
        return f"the GPT's {heads} attention heads do not split over {tp} tensor-parallel ranks"
    return None


def tp_plan() -> dict[str, Any]:
    """One block's plan: column-wise q, k, v, fc; row-wise projections; replicated inputs."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    plan: dict[str, Any] = {name: PrepareModuleInput(input_layouts=(Replicate(),),
                                                     desired_input_layouts=(Replicate(),))
                            for name in INPUTS}
    plan.update({name: ColwiseParallel() for name in COLWISE})
    plan.update({name: RowwiseParallel() for name in ROWWISE})
    return plan


def parallelize_gpt(model: nn.Module, tp_mesh, timer: TPCommTimer | None = None) -> nn.Module:
    """Shard every block of a GPT over the 1-D ``tp_mesh`` in place (see the module doc);
    with ``timer``, its all-reduces are marked on metered steps. Returns ``model``."""
    from torch.distributed.tensor.parallel import parallelize_module

    reason = why_not_tp(model, tp_mesh.size())
    if reason:
        raise ValueError(reason)
    for block in blocks(model):
        parallelize_module(block, tp_mesh, tp_plan())
        if timer is not None:
            timer.attach(block)
    return model


def fsdp_tp(model: nn.Module, mesh, timer: TPCommTimer | None = None) -> nn.Module:
    """2-D: tensor parallelism over ``mesh["tp"]``, then every block and the whole model
    ``fully_shard``-ed over ``mesh["dp"]`` (torchtitan's order: tp first, fsdp outside)."""
    from torch.distributed.fsdp import fully_shard

    parallelize_gpt(model, mesh["tp"], timer)
    for block in blocks(model):
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on the CPU (a collective for DTensors: call on every rank)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in model.named_parameters()}


def _wait(value: Any) -> None:
    """Block until a functional collective's result is there (it is waited lazily)."""
    trigger = getattr(value, "trigger_wait", None)
    if trigger is not None:
        trigger()


class _Tap(torch.autograd.Function):
    """Identity whose backward calls ``fn(grad)`` first (marks the backward all-reduces)."""

    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.fn(grad)
        return grad, None


class TPCommTimer(FSDPCommTimer):
    """The marks of a metered step's tensor-parallel all-reduces (4 per block) in the
    strategy's meter (``meter.comm``), and their bytes (``count_bytes``; off where fully_shard's
    collectives share the timer, which would make a bandwidth of them meaningless). On the
    CPU (gloo) the training thread waits for each (exposed, as fsdp's, whose ``split`` it
    keeps); on GPUs the marks are CUDA events on the compute stream and the split is not
    claimed. ``delay_s`` (debug.comm_delay_s) holds back each all-reduce that long, on every
    step."""

    def __init__(self, meter: Meter, delay_s: float = 0.0, count_bytes: bool = True):
        super().__init__(meter, delay_s)
        self.count_bytes = count_bytes
        self._t0: Any = None  # the running forward all-reduce's start mark
        self._t1: Any = None  # ... and the backward one's

    def attach(self, block: nn.Module) -> None:
        """Hooks on a parallelized block (after torch's own, around them)."""
        for name in ROWWISE:
            layer = block.get_submodule(name)
            layer.register_forward_hook(self._forward_start, prepend=True)
            layer.register_forward_hook(self._forward_end)
        for name in INPUTS:
            sub = block.get_submodule(name)
            sub.register_forward_pre_hook(self._backward_end, prepend=True)
            sub.register_forward_pre_hook(self._backward_start)

    def _on(self) -> bool:
        return self.meter.on or self.delay_s > 0

    def _forward_start(self, module, args, out):
        if self._on():
            self._t0 = self.meter.clock.mark()

    def _forward_end(self, module, args, out):
        if not self._on():
            return
        _wait(out)
        self._done(self._t0, out)

    def _backward_start(self, module, args):
        if not self._on() or not torch.is_grad_enabled():
            return None
        return (_Tap.apply(args[0], self._grad_ready), *args[1:])

    def _backward_end(self, module, args):
        if not self._on() or not torch.is_grad_enabled():
            return None
        return (_Tap.apply(args[0], self._grad_reduced), *args[1:])

    def _grad_ready(self, grad) -> None:
        self._t1 = self.meter.clock.mark()

    def _grad_reduced(self, grad) -> None:
        _wait(grad)
        self._done(self._t1, grad)

    def _done(self, start: Any, value: torch.Tensor) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        m = self.meter
        if m.on:
            m.comm.add(start, m.clock.mark())
            if self.count_bytes:
                m.comm_bytes += value.numel() * value.element_size()
