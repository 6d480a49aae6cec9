"""Every parallelism as a function of a model and a dimension of one device mesh, composed by
:func:`parallelize` in one documented order (torchtitan's ``parallelize_llama``; picotron's
one short idea each). The rank strategy (``gputui.train.strategies.rank``) calls it once.

The mesh (:func:`build_mesh`) has the dimensions of ``gputui.core.mesh.MeshShape`` whose degree
is above 1, outermost first: ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``. The order the
functions run in, each on what the one before made:

1. :func:`apply_tp`: tensor parallelism of the built-in GPT over ``mesh["tp"]``, Megatron-style
   with ``torch.distributed.tensor.parallel``: q, k, v and the MLP's first layer column-wise
   (each rank computes its heads and its slice of the MLP), the attention and MLP output
   projections row-wise (each rank's partial sum all-reduced). Each block's attention and MLP
   take their input as one replicated DTensor (``PrepareModuleInput``), so backward all-reduces
   once per sub-layer: per block and step 4 all-reduces of a ``batch x context x n_embd``
   activation, 2 in forward, 2 in backward. Attention runs on plain tensors of this rank's
   heads (a DTensor there fails on the CPU). Embeddings, norms and the tied head stay
   replicated.
2. ``apply_cp`` (``gputui.train.context_parallel``): context parallelism over ``mesh["cp"]``:
   each sequence split zig-zag over the cp ranks, the GPT's attention a ring of key/value
   blocks (or PyTorch's ``context_parallel`` on CUDA); the cp ranks then average gradients
   with the data-parallel ones (below: DDP's group and fully_shard's mesh include cp,
   torchtitan's ``dp_shard_cp``).
3. :func:`apply_ac`: activation checkpointing of each block, full (only the block's input kept,
   everything recomputed in backward) or selective (torch's selective-checkpoint policy: the
   matmuls' and attention's outputs kept, the cheap elementwise work recomputed). The block's
   ``forward`` is wrapped in place, so parameter names and checkpoints do not change.
4. :func:`apply_fsdp` (here) or :func:`apply_ddp` (the strategy's, around the flattened and
   maybe compiled model a step calls): the data-parallel dimensions. ``fully_shard`` over
   ``dp_shard`` (ZeRO-3; ZeRO-2 keeps the parameters gathered from forward to backward:
   ``reshard_after_forward=False``), over ``(dp_replicate, dp_shard)`` for HSDP (and for any
   data-parallel dimension beside tp: torch's DDP does not take DTensors); else
   DistributedDataParallel over the data-parallel ranks, with ZeRO-1's sharded optimizer state
   (:func:`zero1_optimizer`) where the mesh shards at stage 1.

Before 2 and 3, :func:`apply_ep` for a mixture-of-experts GPT (``gputui.train.moe``): each MoE
layer's capacity rule spans the data-parallel ranks, and with ``ep > 1`` the experts are sharded
over groups of ``ep`` consecutive data-parallel ranks (tokens exchanged by two all-to-alls a
layer); the expert parameters are then left out of DDP and fully_shard, their gradients summed
over the ranks holding the same experts only (the strategy's, after backward).

Compilation (``run.compile``) applies to the plain DDP model only (the strategy compiles what
DDP wraps); fully_shard's and tensor parallelism's hooks are not compiled here.

:class:`TPCommTimer` marks tensor parallelism's all-reduces on metered steps with module hooks
around the ones torch registers (forward: the row-wise layers' outputs; backward: an identity
autograd node on each side of the input's redistribution), in the shape the breakdown reads
(``meter.comm``, :mod:`~gputui.train.strategies.meter`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gputui.core.config import ConfigError
from gputui.core.mesh import DIMS, MeshShape, tp_heads_problem
from gputui.train.strategies.fsdp_comm import FSDPCommTimer
from gputui.train.strategies.meter import Meter

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from gputui.train.context_parallel import ContextParallel

# the linears tensor parallelism shards in each block, and how (GPT's module names)
COLWISE = ("attn.q", "attn.k", "attn.v", "mlp.fc")
ROWWISE = ("attn.proj", "mlp.proj")
INPUTS = ("attn", "mlp")  # sub-layers whose input is replicated once for their colwise linears


# ---------------------------------------------------------------- the mesh
def build_mesh(device_type: str, shape: MeshShape) -> DeviceMesh:
    """The device mesh of ``shape`` over every rank (a collective: every rank calls it). A
    data-parallel dimension beside replicas that fully_shard takes is kept even at size 1:
    HSDP's mesh is always 2-D."""
    from torch.distributed.device_mesh import init_device_mesh

    dims = dict(shape.dims())
    if shape.data_parallel == "fsdp" and (shape.dp_replicate > 1 or shape.cp > 1):
        dims.setdefault("dp_shard", 1)  # fully_shard over dp_shard x cp (flattened) needs it
    names = tuple(d for d in DIMS if d in dims)
    return init_device_mesh(device_type, tuple(dims[d] for d in names), mesh_dim_names=names)


def dp_dims(mesh: DeviceMesh) -> tuple[str, ...]:
    """The mesh's dimensions whose ranks average gradients, outermost first: the
    data-parallel ones and cp (its ranks train on parts of the same sequences)."""
    names = mesh.mesh_dim_names or ()
    return tuple(d for d in ("dp_replicate", "dp_shard", "cp") if d in names)


def dp_coordinate(mesh: DeviceMesh, shape: MeshShape) -> int:
    """This rank's data-parallel group (0 .. dp - 1): which slice of each batch it takes."""
    names = mesh.mesh_dim_names or ()
    coord = dict(zip(names, mesh.get_coordinate() or [0] * len(names), strict=True))
    return coord.get("dp_replicate", 0) * shape.dp_shard + coord.get("dp_shard", 0)


def dp_group(mesh: DeviceMesh, shape: MeshShape):
    """The process group of this rank's data-parallel peers (every dp dimension flattened);
    None when the data-parallel ranks are the whole world (the default group)."""
    dims = dp_dims(mesh)
    if shape.dp * shape.cp == shape.world or not dims:
        return None
    sub = mesh[dims] if len(dims) > 1 else mesh[dims[0]]
    if len(dims) > 1:
        sub = sub._flatten("dp")  # torch 2.5+: one group over both dimensions
    return sub.get_group()


# ---------------------------------------------------------------- tensor parallelism
def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a GPT (``gpt.Block``), in order, anywhere in the model (a
    pipeline stage holds some of them under its own names)."""
    from gputui.train.gpt import Block

    return [m for m in model.modules() if isinstance(m, Block)]


def why_not_tp(model: nn.Module, tp: int) -> str | None:
    """None when ``model`` can be split over ``tp`` ranks, else the reason (one line)."""
    found = blocks(model)
    if not found:
        return "tensor parallelism needs the built-in GPT (model.name = 'gpt'): its blocks' " \
               "q, k, v and MLP layers are what it shards"
    attn: Any = found[0].attn
    return tp_heads_problem(attn.q.out_features // attn.head_dim, tp)


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


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, timer: TPCommTimer | None = None) -> nn.Module:
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


# ---------------------------------------------------------------- activation checkpointing
def ac_blocks(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The blocks activation checkpointing wraps: the GPT's, the modules of the classes
    ``names`` (strategy.fsdp_wrap) or what the model's ``gputui_blocks()`` returns. A model
    with none of those is a ConfigError naming the fix."""
    found = blocks(model)
    if found:
        return found
    if names:
        return fsdp_targets(model, names)
    declared = getattr(model, "gputui_blocks", None)
    if callable(declared):
        return [m for m in declared() if isinstance(m, nn.Module)]
    raise ConfigError(f"parallel.ac checkpoints each block, and {type(model).__name__} names "
                      f"none: set strategy.fsdp_wrap = ['YourBlock'] or give the model a "
                      f"gputui_blocks() method returning its blocks")


@functools.cache
def _saved_ops() -> frozenset:
    """The ops whose outputs selective checkpointing keeps: the matmuls and attention (the
    expensive ones to recompute), each where this torch has it."""
    aten = torch.ops.aten
    names = [("mm", "default"), ("addmm", "default"), ("bmm", "default"),
             ("_scaled_dot_product_flash_attention", "default"),
             ("_scaled_dot_product_efficient_attention", "default"),
             ("_scaled_dot_product_cudnn_attention", "default"),
             ("_scaled_dot_product_flash_attention_for_cpu", "default")]
    out = set()
    for op, overload in names:
        packet = getattr(aten, op, None)
        if packet is not None and hasattr(packet, overload):
            out.add(getattr(packet, overload))
    return frozenset(out)


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = _saved_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread now (a checkpointed
    block's second forward is its recomputation)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def apply_ac(model: nn.Module, mode: str, names: list[str] | None = None,
             meter: Meter | None = None) -> int:
    """Checkpoint each block's activations (``mode``: full or selective; none does nothing):
    the block's forward runs under ``torch.utils.checkpoint`` (non-reentrant), so backward
    recomputes what it did not keep; with ``meter``, a metered step's recomputation is
    marked in ``meter.recompute``. Returns how many blocks."""
    if mode == "none":
        return 0
    from torch.utils.checkpoint import checkpoint

    found = ac_blocks(model, list(names or []))
    for block in found:
        inner = block.forward
        context = {"context_fn": _selective_context} if mode == "selective" else {}

        def timed(*args, _inner=inner, **kwargs):
            if meter is None or not meter.on or not _in_backward():
                return _inner(*args, **kwargs)
            with meter.recompute:
                return _inner(*args, **kwargs)

        def forward(*args, _timed=timed, _context=context, **kwargs):
            return checkpoint(_timed, *args, use_reentrant=False, **_context, **kwargs)

        block.forward = forward  # the instance's own: names and hooks unchanged
    return len(found)


# ---------------------------------------------------------------- data parallelism
def fsdp_targets(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules that get their own fully_shard, innermost first (FSDP2 shards bottom-up):
    those whose class name is in ``names`` (strategy.fsdp_wrap), or every top-level block
    that holds parameters of its own: a block sharing a parameter with another (a head tied
    to the embedding) is left to the root's unit, since one parameter cannot be sharded by
    two units. A name no module has is a ConfigError."""
    if not names:
        top = [m for m in _top_blocks(model) if any(True for _ in m.parameters())]
        owners: dict[int, int] = {}
        for i, block in enumerate(top):
            for p in block.parameters():
                owners.setdefault(id(p), i)
        shared = {i for i, block in enumerate(top)
                  for p in block.parameters() if owners[id(p)] != i}
        shared |= {owners[id(p)] for i in shared for p in top[i].parameters()}
        return [b for i, b in enumerate(top) if i not in shared]
    found = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    seen = {type(m).__name__ for m in found}
    unknown = [n for n in names if n not in seen]
    if unknown:
        classes = sorted({type(m).__name__ for m in model.modules() if m is not model})
        raise ConfigError(f"strategy.fsdp_wrap names {', '.join(unknown)}, which no module of "
                          f"the model is; its module classes: {', '.join(classes)}")
    return found[::-1]  # modules() lists parents before children


def _top_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's top-level blocks: its children, a ModuleList's or ModuleDict's opened (a
    container has no forward of its own, so it cannot be a unit; its blocks are)."""
    out: list[nn.Module] = []
    for child in model.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += _top_blocks(child)
        else:
            out.append(child)
    return out


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, zero: int,
               names: list[str] | None = None, ignored: set | None = None) -> int:
    """``fully_shard`` each target (see :func:`fsdp_targets`) and then the whole model over the
    data-parallel dimensions of ``mesh`` (2-D: HSDP, replicas of shards). ZeRO-3 frees each
    unit's gathered parameters after its forward (gathered again for backward); ZeRO-2 keeps
    them from forward to backward (one all-gather a step, more memory). Returns the number of
    units besides the root."""
    from torch.distributed.fsdp import fully_shard

    dims = dp_dims(mesh)
    flat = None
    if "cp" in dims:  # torchtitan's dp_shard_cp: the cp ranks shard with the dp_shard ones
        flat = mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
        dims = tuple(d for d in dims if d not in ("dp_shard", "cp")) + ("dp_shard_cp",)
    if flat is not None and len(dims) == 1:
        dp_mesh = flat  # the flattened mesh itself (slicing it from the root is deprecated)
    else:  # HSDP beside cp slices (dp_replicate, dp_shard_cp) from the root
        dp_mesh = mesh[dims] if len(dims) > 1 else mesh[dims[0]]
    targets = fsdp_targets(model, list(names or []))
    # parameters another parallelism owns (ep's experts) stay out of every unit
    extra: dict[str, Any] = {"ignored_params": ignored} if ignored else {}
    for unit in targets:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=zero >= 3, **extra)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=zero >= 3, **extra)
    return len(targets)


class EPGroups:
    """Expert parallelism's process groups for this rank: ``tokens`` (the data-parallel ranks
    one capacity rule spans; None with one rank), ``ep`` (its expert-parallel group: ep
    consecutive data-parallel ranks), ``replicas`` (the ranks holding the same experts in the
    other ep groups; None when there are none), and its place ``ep_rank`` in its group, whose
    first rank is ``first`` among ``tokens``' ranks."""

    def __init__(self, mesh: DeviceMesh, shape: MeshShape):
        import torch.distributed as dist

        group = dp_group(mesh, shape)
        self.tokens = group if group is not None else (
            dist.group.WORLD if shape.dp > 1 else None)
        me = dp_coordinate(mesh, shape)
        ep = shape.ep
        self.ep_rank, self.first = me % ep, me - me % ep
        self.ep: Any = None
        self.replicas: Any = None
        if ep == 1:
            return
        # every rank creates every group, in one order (new_group is a collective); the
        # data-parallel ranks are the global ones here (ep takes neither tp nor pp)
        for start in range(0, shape.dp, ep):
            g = dist.new_group(list(range(start, start + ep)))
            if start == self.first:
                self.ep = g
        if shape.dp > ep:
            for i in range(ep):
                g = dist.new_group(list(range(i, shape.dp, ep)))
                if i == self.ep_rank:
                    self.replicas = g


def apply_ep(model: nn.Module, groups: EPGroups, ep: int,
             meter: Meter | None = None) -> list[nn.Parameter]:
    """A mixture-of-experts GPT over the mesh: its MoE layers' capacity rule over the
    data-parallel ranks, and its experts sharded over ``ep`` ranks (``gputui.train.moe``).
    Returns the expert parameters (empty when the model has no MoE layer)."""
    from gputui.train import moe

    return moe.shard_experts(model, groups.tokens, groups.ep, ep, groups.ep_rank,
                             groups.first, meter)


def apply_ddp(model: nn.Module, group, device: torch.device,
              apart: Sequence[nn.Parameter] = ()):
    """DistributedDataParallel over the data-parallel ranks (``group``; None: the world):
    buckets overlap the all-reduce with backward; gradients are views into the buckets.
    ``apart``: parameters DDP leaves alone (ep's experts: their gradients are reduced apart,
    over the ranks holding the same experts)."""
    from torch.nn.parallel import DistributedDataParallel

    if apart:
        ignored = {id(p) for p in apart}
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [n for n, p in model.named_parameters() if id(p) in ignored])
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=group,
                                   gradient_as_bucket_view=True)


def zero1_optimizer(params, kind: type[torch.optim.Optimizer], args: dict[str, Any],
                    group) -> torch.optim.Optimizer:
    """ZeRO-1: the optimizer's state sharded over ``group`` (the dp_shard ranks): each rank
    keeps and updates its partition of the parameters' state, then broadcasts its updated
    parameters (``ZeroRedundancyOptimizer``). The gradients stay whole (DDP's all-reduce)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=kind, process_group=group, **args)


def parallelize(model: nn.Module, mesh: DeviceMesh, shape: MeshShape, fsdp_wrap: list[str],
                tp_timer: TPCommTimer | None = None,
                meter: Meter | None = None,
                cp: ContextParallel | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Apply the mesh's parallelisms to ``model`` in the documented order (tp, cp, ep, ac,
    then fsdp; DDP is the strategy's, around what a step calls). Returns the model (sharded
    in place) and what was done, for the run's notes: {"ac_blocks", "fsdp_units", "experts"
    (the expert parameters ep shards, left to the strategy's own gradient reduction),
    "ep_groups"}."""
    done: dict[str, Any] = {"ac_blocks": 0, "fsdp_units": 0, "experts": [], "ep_groups": None}
    if shape.tp > 1:
        try:
            apply_tp(model, mesh["tp"], tp_timer)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cp is not None:  # the sequence split over mesh["cp"] (gputui.train.context_parallel)
        from gputui.train.context_parallel import apply_cp

        try:
            apply_cp(model, cp)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    from gputui.train.moe import layers

    if layers(model):
        groups = done["ep_groups"] = EPGroups(mesh, shape)
        try:
            experts = apply_ep(model, groups, shape.ep, meter)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        done["experts"] = experts if shape.ep > 1 else []
    done["ac_blocks"] = apply_ac(model, shape.ac, fsdp_wrap, meter)
    if shape.data_parallel == "fsdp":
        done["fsdp_units"] = apply_fsdp(model, mesh, shape.zero, fsdp_wrap,
                                        set(done["experts"]))
    return model, done


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
            m.collective("tp all-reduce", start, m.clock.mark())
            if self.count_bytes:
                m.comm_bytes += value.numel() * value.element_size()
