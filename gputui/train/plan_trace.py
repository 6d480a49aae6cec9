"""The plan's tracer (``gputui plan``): one rank of a mesh, traced without the machine.

On rank 0 of a fake process group of the planned world size
(``init_process_group("fake", store=FakeStore())``, torch's testing helper) and under
``FakeTensorMode`` (tensors with shapes and dtypes but no storage), the real GPT is built at the
size asked, the real parallelism functions of the mesh are applied to it
(:func:`gputui.train.parallelize.parallelize`: tp, activation checkpointing, fully_shard; DDP
around it for replicas), and one AdamW step runs under torch's memory tracker
(``FSDPMemTracker`` where fully_shard holds the model, else ``MemTracker``), the whole-step FLOP
counter (``flops.counter(modules=False)``) and :class:`CommLog` (every collective the fake group
is handed: kind, bytes, group size), after a step of zero gradients that makes AdamW's state
(no forward or backward: the traced step holds what every later step holds; a GPU plan's
multi-tensor update makes its state up front and runs on the parameters' local parts:
:class:`LocalUpdate`). The same code
runs on real tensors in a real gloo group (``fake = False``, its ``steps`` full steps): what
the benchmark measures the plan against.

A stack of identical blocks costs the same per block, so each mesh is traced at 2 and 3 blocks
(1 and 2 for a stack of one) and every figure extrapolated linearly to ``n_layer`` (exact for
parameters, gradients, optimizer state, activations, FLOPs and collectives; the peak moves by
the same per-block step). Not from 1 block: a lone block is the first and the last at once,
and its peak comes at another moment (fully_shard at ZeRO-3: the whole model gathered and no
all-gather buffer at 1 block, one block gathered and one buffer from 2 blocks on, so the
buffers extrapolated from 1 and 2 grew by a block's each block: 0.29 GiB at 12 blocks of
GPT-2 small's width where a 12-block trace holds 27 MiB).

Context parallelism is traced: the rank's zig-zag part of every sequence and gputui's ring
attention (:mod:`gputui.train.context_parallel`), whose isend/irecv hops the fake group takes;
each hop is logged as one ``cp ring send`` of its bytes. A mixture of experts is traced through
the MoE layer's planned dispatch under fake tensors (``MoE._planned``: the router's choices are
values, so tokens are routed evenly over the experts and kept by the capacity rule; marked as
such in ``formula``), ep's all-to-alls and expert gradient all-reduce included.

Pipeline schedules do not run on one fake rank (their stages exchange shapes and activations
point to point): a pp mesh traces one stage (n_layer / pp blocks) at the micro-batch size,
and the micro-batches in flight, the bubble and the sends are formulas, marked as such in
``formula``.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gputui.core.errors import brief, fault_line
from gputui.core.mesh import MeshShape, stages_per_rank
from gputui.train.flops import counter as flop_counter
from gputui.train import moe, optim

_TOTAL_KEY = "Total"  # the key of a tracker snapshot's sum (torch's mem_tracker)

RING = "cp ring send"  # the plan's name of a ring hop (a block of keys and values, or grads)
MOE_KEYS = ("moe_experts", "moe_top_k", "moe_capacity_factor")  # a spec's model's, with MoE

KINDS = {"allgather": "all-gather", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
         "allreduce": "all-reduce", "all_reduce": "all-reduce", "broadcast": "broadcast",
         "all_to_all": "all-to-all", "alltoall": "all-to-all", "send": "send", "recv": "recv"}


def kind_of(op_name: str) -> str:
    """'all-gather', 'reduce-scatter', 'all-reduce', ... from a c10d op's name."""
    for key, kind in KINDS.items():
        if key in op_name:
            return kind
    return op_name


class CommLog(TorchDispatchMode):
    """Every collective dispatched while active, as the process group is handed it: its kind,
    bytes (torch's ``CollectiveOp.get_comm_tensor_size``) and group size, and the phase
    (``phase``: set by the caller: forward, backward, optimizer)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed._tools.fake_collectives import collective_ops, sync_ops

        self.ops = collective_ops - sync_ops
        self.phase = "forward"
        self.calls: list[tuple[str, str, int, int]] = []  # (kind, phase, bytes, group)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        if func in self.ops:
            from torch.distributed._tools.fake_collectives import CollectiveOp

            try:
                size = int(CollectiveOp.get_comm_tensor_size(func, res, args, kwargs or {}))
                group = CollectiveOp.get_process_group(func, args).size()
            except (TypeError, RuntimeError, AttributeError):
                size, group = 0, 0
            self.calls.append((kind_of(func.__name__), self.phase, size, group))
        return res

    def summary(self) -> list[dict[str, Any]]:
        """The calls grouped by (kind, phase, group size): count and bytes."""
        out: dict[tuple[str, str, int], dict[str, Any]] = {}
        for kind, phase, size, group in self.calls:
            row = out.setdefault((kind, phase, group), {"kind": kind, "phase": phase,
                                                        "group": group, "count": 0, "bytes": 0})
            row["count"] += 1
            row["bytes"] += size
        return list(out.values())


def _categories(tracker: Any, fsdp: bool) -> dict[str, int]:
    """The tracker's snapshot at the peak, in the plan's categories (bytes)."""
    snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap.values())) if snap else {}
    got = {str(getattr(k, "value", k)): int(v) for k, v in dev.items()}
    if fsdp:
        out = {"params": got.get("Sharded Param", 0),
               "gathered": got.get("Unsharded Param", 0),
               "grads": got.get("Sharded Grad", 0) + got.get("Unsharded Grad", 0),
               "optim": got.get("OptState", 0), "activations": got.get("Activation", 0),
               "temps": got.get("Temp", 0) + got.get("Inputs", 0),
               "buffers": got.get("All Gather", 0) + got.get("Reduce Scatter", 0)
               + got.get("Buffer", 0)}
    else:
        out = {"params": got.get("Parameter", 0), "gathered": 0,
               "grads": got.get("Gradient", 0), "optim": got.get("Optstate", 0),
               "activations": got.get("Activation", 0),
               "temps": got.get("Temp", 0) + got.get("Other", 0),
               "buffers": got.get("Buffer", 0)}
    out["peak"] = int(got.get("Total", sum(out.values())))
    return out


def _now(tracker: Any, category: str) -> int:
    """The tracker's current bytes of one category (its value's name)."""
    snap = tracker.get_tracker_snapshot()
    dev = next(iter(snap.values())) if snap else {}
    return int(sum(v for k, v in dev.items() if str(getattr(k, "value", k)) == category))


def trace_stack(spec: dict[str, Any], n_layer: int, mesh: Any, fake: bool = True,
                steps: int = 2) -> dict[str, Any]:
    """One rank's figures for ``spec``'s model at ``n_layer`` blocks on ``mesh`` (already
    built over the process group): the tracker's categories at the last step's peak, the
    FLOPs of the first step (a step's FLOPs are every step's), the last step's collectives,
    and (real tensors) the median of its timed steps. Fake tensors: one traced step after the
    optimizer's state is made (``steps`` is for real tensors)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from gputui.train import parallelize as par
    from gputui.train.gpt import GPTShape, gpt, lm_loss

    m = spec["model"]
    shape = MeshShape(**spec["mesh"])
    if fake:
        # what earlier traces left in reference cycles is collected now, not at some moment
        # of this one (the cyclic collector freed it mid-step at a point set by what ran
        # before: with activation checkpointing the same mesh's peak came out 737-929 MB at
        # GPT-2 small's width by its place in the child's list)
        gc.collect()
    g = GPTShape(vocab_size=m["vocab"], context=m["context"], n_layer=n_layer,
                 n_head=m["n_head"], n_embd=m["n_embd"], tie=m["tie"],
                 **{k: m[k] for k in MOE_KEYS if k in m})
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec["precision"])
    micro, chunks = spec["micro_batch"], spec["micro_batches"]
    context_mode: Any
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        context_mode = FakeTensorMode(allow_non_fake_inputs=True)
    else:
        context_mode = contextlib.nullcontext()
    with context_mode, _propagation_untraced(fake):
        torch.manual_seed(0)
        model: nn.Module = gpt(g)
        cp = _context_parallel(mesh, shape)
        with _meshes_real(fake):
            _, done = par.parallelize(model, mesh, shape, [], cp=cp)
        experts, ep_groups = done["experts"], done["ep_groups"]
        moe_layers = moe.layers(model)
        aux_weight = float(m.get("moe_aux_weight", 0.01))
        step_model: nn.Module = model
        ddp = shape.data_parallel == "ddp"
        if ddp and not fake:  # ep's experts reduced apart, as the run
            step_model = par.apply_ddp(model, par.dp_group(mesh, shape), torch.device("cpu"),
                                       apart=experts)

        def sliced() -> Any:
            """This rank's part of every sequence for a forward and its backward (cp: held
            over both, as the run holds it: a checkpointed block recomputes its ring)."""
            return cp.step(x, y) if cp is not None else contextlib.nullcontext((x, y))

        def forward_loss(xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                loss = lm_loss(step_model(xy[0]), xy[1]) / chunks
                aux = moe.aux_term(moe_layers, aux_weight)
                return loss if aux is None else loss + aux / chunks

        def reduce_experts() -> None:
            if experts:
                moe.reduce_expert_grads(experts, shape.dp, ep_groups.replicas)
        opt_kwargs: dict[str, Any] = {"lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}
        if spec.get("foreach") and not optim.mixes_dtensors(list(model.parameters())):
            # a GPU run's: torch takes the multi-tensor update by default on CUDA (one
            # kernel a group of tensors, and their temporaries all at once)
            opt_kwargs["foreach"] = True
        if ddp and shape.dp_shard > 1 and not fake:
            opt: Any = par.zero1_optimizer(
                model.parameters(), torch.optim.AdamW, opt_kwargs,
                mesh["dp_shard"].get_group())
        else:
            opt = _optimizer(model, opt_kwargs, fake)
        fsdp = shape.data_parallel == "fsdp"
        # the optimizer the trackers hook (its step's tensors) and whose state they file
        tracked = opt.inner if isinstance(opt, LocalUpdate) else opt
        tracker: Any = _rank_peak_only(FSDPMemTracker(model, tracked) if fsdp
                                       else MemTracker())
        if not fsdp:
            tracker.track_external(model, tracked)
        elif experts:  # ep's experts stay out of fully_shard, and so out of its tracker's
            _track_experts(tracker, experts)  # view (its track_external does nothing)
        x = torch.randint(0, g.vocab_size, (micro, g.context))
        y = torch.randint(0, g.vocab_size, (micro, g.context))
        comm = CommLog()
        # the step's total only: torch's counter with its module tracking kept checkpointed
        # blocks' recomputed tensors alive (GPT-2 small, full checkpointing: 5.76 GiB
        # planned, 2.86 on an H200), so it counted a step apart from the traced one
        flops = flop_counter(modules=False)
        seconds = 0.0
        forward_act = 0
        forward_total = 0
        if fake and not isinstance(opt, LocalUpdate):
            # the optimizer's state made first, by a step of zero gradients: what the traced
            # step holds is what every step after the first holds, without a forward and
            # backward of its own (the trace's cost by operation; a LocalUpdate made it)
            with tracker:
                for p in model.parameters():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
                opt.step()
                opt.zero_grad()
            tracker.reset_mod_stats()
        if fake:
            steps = 1
        for step in range(steps):
            last = step == steps - 1
            t0 = time.perf_counter()
            # each step entered anew: entering sets the tracker's peak to what is held now,
            # so the peak is the last step's, with the optimizer state (a first step's own
            # peak, before that state exists, won at 1 block and lost at 2 for tp 2, and the
            # extrapolation mixed the two moments); FLOPs and operations counted on it too
            # (real tensors: a first step also makes the optimizer's state, operations a
            # later step does not dispatch)
            with tracker, (flops if last else _null()), (comm if last else _null()):
                comm.phase = "forward"
                for i in range(chunks):
                    sync = _no_sync(step_model, i < chunks - 1)
                    with sync, sliced() as xy:
                        loss = forward_loss(xy)
                        if last:  # what autograd keeps is largest as backward begins
                            forward_act = _now(tracker, "Activation")
                            forward_total = _now(tracker, "Total")
                        comm.phase = "backward"
                        loss.backward()
                        comm.phase = "forward"
                comm.phase = "backward"
                reduce_experts()
                comm.phase = flops.phase = "optimizer"
                opt.step()
                opt.zero_grad()
                flops.phase = "step"
            seconds = time.perf_counter() - t0
            if not last:
                tracker.reset_mod_stats()
        out = _categories(tracker, fsdp)
        # the tracker files every tensor made inside opt.step as optimizer state, the
        # foreach update's temporaries too: where the peak is in the step (a short context),
        # the optim column was the state and those (18 MiB more at GPT-2 small's width,
        # context 64). The state is what the optimizer keeps; the rest of it at the peak is
        # temporaries (the peak does not move)
        state = _state_bytes(opt)
        if out["optim"] > state:
            out["temps"] += out["optim"] - state
            out["optim"] = state
        # the activations column: as backward begins (the peak's own moment may come later,
        # when backward has freed some of them); the peak stays the tracker's
        out["activations"] = max(out["activations"], forward_act)
        # what the rank holds as backward begins is a moment of the step too: the peak is
        # never below it (kept apart, so that each depth's is extrapolated on its own)
        out["at_backward"] = forward_total
        if not fake:  # the step's time, outside every tracking mode
            times = []
            for _ in range(int(spec.get("timed_steps", 4))):
                t0 = time.perf_counter()
                for i in range(chunks):
                    with _no_sync(step_model, i < chunks - 1), sliced() as xy:
                        forward_loss(xy).backward()
                reduce_experts()
                opt.step()
                opt.zero_grad()
                times.append(time.perf_counter() - t0)
            seconds = sorted(times)[len(times) // 2]
    params = sum(p.numel() for p in model.parameters())
    calls = comm.summary()
    if cp is not None:  # the ring's hops: each a send and a receive of one block, one named
        calls = [dict(c, kind=RING) if c["kind"] == "send" else c for c in calls
                 if c["kind"] != "recv"]
    return {"mem": out, "flops": int(flops.get_total_flops()), "comm": calls,
            "work": flops.work, "seconds": seconds, "local_params": int(params),
            "param_tensors": len(list(model.parameters())),
            "expert_params": int(sum(p.numel() for p in experts))}


def _rank_peak_only(tracker: Any) -> Any:
    """``tracker`` keeping the rank's own peak but not each module's: after every op torch's
    trackers walk all the modules they have seen for those that are running, to raise each
    one's peak (a plan reads none of them). The rank's peak is kept as torch keeps it (GPT-2
    small on 8xH100: the same figures, 58 CPU-s to trace in place of 64). A torch whose
    tracker lacks the fields this reads keeps its own walk."""
    if not all(hasattr(tracker, a) for a in ("_update_peak_stats", "_curr_mem_snap",
                                              "_peak_mem", "_peak_mem_snap")):
        return tracker

    def update(peak_state: Any) -> None:
        for dev, snap in tracker._curr_mem_snap.items():
            if tracker._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                tracker._peak_mem[dev] = snap[_TOTAL_KEY]
                tracker._peak_mem_snap[dev] = dict(snap)

    tracker._update_peak_stats = update
    return tracker


def _track_experts(tracker: Any, experts: list[nn.Parameter]) -> None:
    """The expert parameters fully_shard ignores, filed with the rank's parameters in
    ``FSDPMemTracker`` (not seen otherwise: they were made before it started)."""
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    for p in experts:
        tracker._update_and_maybe_create_winfos(p, _FSDPRefType.SHARDED_PARAM)


def _context_parallel(mesh: Any, shape: MeshShape) -> Any:
    """The run's context parallelism over the mesh's cp ranks (None without it), as the rank
    strategy makes it: gputui's ring attention (the plan traces the ring, which runs on the
    fake group: its hops are isend/irecv pairs, logged with their bytes)."""
    if shape.cp == 1:
        return None
    from gputui.train.context_parallel import ContextParallel

    names = mesh.mesh_dim_names or ()
    cp_mesh = mesh["cp"] if "cp" in names else mesh
    return ContextParallel(cp_mesh.get_group(), None, torch.device("cpu"), cp_mesh,
                           kind="ring")


_TORCH_STATE = ("amsgrad", "fused", "capturable", "differentiable")  # LocalUpdate makes none


def _optimizer(model: nn.Module, kwargs: dict[str, Any], fake: bool) -> Any:
    """The step's AdamW over ``model``: a trace's multi-tensor one (a GPU plan's) as a
    :class:`LocalUpdate`, its state made up front (the state it knows how to make: no
    amsgrad, fused or capturable update, whose state differs)."""
    params = list(model.parameters())
    if fake and kwargs.get("foreach") and not any(kwargs.get(k) for k in _TORCH_STATE):
        return LocalUpdate(params, torch.optim.AdamW, kwargs)
    return optim.build(torch.optim.AdamW, kwargs, params)


class LocalUpdate:
    """A trace's multi-tensor (foreach) Adam-family update with its state made up front, run
    on the local parts of DTensor parameters (plain ones as they are).

    - The local parts: what a run's DTensor update does once DTensor has chosen each output's
      placement (its inputs': an elementwise update of a parameter, its gradient and state,
      all placed alike, moves nothing between ranks; checked at each step), on the same
      storages, so the same bytes, temporaries and state, without DTensor's choosing. That
      choice is not cached across the lists of a foreach call: on a 3-D mesh (dp_replicate 4
      x tp 2, HSDP beside tp, at GPT-2 small's width) it was 4.2 of the trace's 7.0 CPU-s.
    - The state: as torch's first step makes it (``_init_group`` of Adam and AdamW without
      amsgrad, fused or capturable: a CPU step count, 0-d, and two moments shaped as each
      parameter), in place of a step of zero gradients that made it; the test checks the
      parameters after three real updates against torch's own.
    - Its operations are counted as plain ones: a GPU plan, the only one tracing this
      update, prices no host dispatch."""

    def __init__(self, params: list[nn.Parameter], kind: type[torch.optim.Optimizer],
                 kwargs: dict[str, Any]) -> None:
        if not issubclass(kind, torch.optim.Adam):
            raise TypeError(f"LocalUpdate makes an Adam-family state, not {kind.__name__}'s")
        self.params = params
        self.local = [p._local_tensor if hasattr(p, "_local_tensor") else p for p in params]
        self.inner = kind(self.local, **kwargs)
        self.state = self.inner.state
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        for local in self.local:
            self.state[local] = {
                "step": torch.tensor(0.0, dtype=scalar, device="cpu"),
                "exp_avg": torch.zeros_like(local, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(local, memory_format=torch.preserve_format)}

    def step(self) -> None:
        try:
            for p, local in zip(self.params, self.local, strict=True):
                if local is not p:
                    self._lend(p, local)
            self.inner.step()
        finally:
            for p, local in zip(self.params, self.local, strict=True):
                if local is not p:
                    local.grad = None

    @staticmethod
    def _lend(p: Any, local: torch.Tensor) -> None:
        """``p``'s gradient's local part as ``local``'s gradient, where both are as the
        update was built for: ``p`` still over ``local`` (fully_shard could make a new local
        part at its lazy init), its gradient placed as it is."""
        if p._local_tensor is not local:
            raise RuntimeError("a parameter's local part changed after its update was built")
        g = p.grad
        if g is not None and getattr(g, "placements", p.placements) != p.placements:
            raise RuntimeError(f"a gradient placed {g.placements} on a parameter placed "
                               f"{p.placements}: its update would move it between ranks")
        local.grad = None if g is None else getattr(g, "_local_tensor", g)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def _state_bytes(opt: Any) -> int:
    """Bytes of what the optimizer keeps between steps (a DTensor's: its local shard)."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    seen: dict[int, int] = {}
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                for storage in get_untyped_storages(v):
                    seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


@contextlib.contextmanager
def _meshes_real(fake: bool) -> Iterator[None]:
    """fully_shard over a tp model joins the dp and tp meshes (``DeviceMesh._concatenate``),
    whose rank coordinates are computed with tensor ops: under fake tensors those have no
    values, so a mesh is built outside the fake mode (its tensors are a few integers)."""
    if not fake:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    init = DeviceMesh.__init__

    def real_init(self, *args, **kwargs):
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    DeviceMesh.__init__ = real_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        DeviceMesh.__init__ = init  # type: ignore[method-assign]


@contextlib.contextmanager
def _propagation_untraced(fake: bool) -> Iterator[None]:
    """DTensor's sharding propagation kept out of the trace, as a run keeps it out of its
    memory: on an op's first sight it runs the op on fake tensors for the output's shape, in
    the fake mode it detects, which under the tracer is the trace's own, so the tracker took
    those tensors for the step's (tp 2's first step at 2 blocks: 0.4 MB more at a moment of
    its own, which the second step, its propagation cached, does not have). With the trace's
    modes set aside, propagation finds no fake mode and makes its own, as in a run."""
    from torch.distributed.tensor import _sharding_prop
    from torch.utils._python_dispatch import _disable_current_modes

    cls = getattr(_sharding_prop, "ShardingPropagator", None)
    own = getattr(cls, "_propagate_tensor_meta_non_cached", None)
    if not fake or own is None:
        yield
        return

    def apart(self: Any, op_schema: Any) -> Any:
        with _disable_current_modes():
            return own(self, op_schema)

    cls._propagate_tensor_meta_non_cached = apart  # type: ignore[union-attr]
    try:
        yield
    finally:
        cls._propagate_tensor_meta_non_cached = own  # type: ignore[union-attr]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _no_sync(model: nn.Module, skip: bool):
    """DDP's no_sync for every micro-batch but the last (fully_shard syncs each: as the run)."""
    sync: Any = getattr(model, "no_sync", None)
    if skip and callable(sync):
        return sync()
    return _null()


def _extrapolate(one: dict[str, Any], two: dict[str, Any], n: int,
                 depth: int = 1) -> dict[str, Any]:
    """Figures at ``n`` blocks from those at ``depth`` and ``depth + 1`` (a stack of identical
    blocks)."""
    def lin(a: float, b: float) -> int:
        return int(round(a + (n - depth) * (b - a)))

    mem = {k: max(0, lin(one["mem"][k], two["mem"].get(k, 0))) for k in one["mem"]}
    # the peak's moment can differ between the two depths (in the optimizer step at one, as
    # backward begins at the other): the peak at n blocks is at least what the rank holds as
    # backward begins there, each moment extrapolated on its own (that moment kept for the
    # formulas that add to it: DDP's buckets)
    mem["peak"] = max(mem["peak"], mem.get("at_backward", 0))
    comm = []
    keyed = {(c["kind"], c["phase"], c["group"]): c for c in two["comm"]}
    for c in one["comm"]:
        d = keyed.pop((c["kind"], c["phase"], c["group"]),
                      {"count": c["count"] * (depth + 1) // depth,
                       "bytes": c["bytes"] * (depth + 1) // depth})
        comm.append(dict(c, count=lin(c["count"], d["count"]), bytes=lin(c["bytes"], d["bytes"])))
    for c in keyed.values():  # a collective only the deeper stack has: one more block's
        comm.append(dict(c, count=c["count"] * (n - depth), bytes=c["bytes"] * (n - depth)))
    per_block = {k: two["mem"][k] - one["mem"][k] for k in mem if k != "at_backward"}
    work = {phase: {k: max(0, lin(v, two.get("work", {}).get(phase, {}).get(k, 0)))
                    for k, v in counts.items()}
            for phase, counts in one.get("work", {}).items()}
    return {"mem": mem, "flops": lin(one["flops"], two["flops"]), "comm": comm, "work": work,
            "local_params": lin(one["local_params"], two["local_params"]),
            "param_tensors": lin(one["param_tensors"], two["param_tensors"]),
            "expert_params": lin(one.get("expert_params", 0), two.get("expert_params", 0)),
            "per_block": per_block, "seconds": lin(one["seconds"], two["seconds"])}


def plan_rank(spec: dict[str, Any], fake: bool = True) -> dict[str, Any]:
    """The figures of rank 0 of ``spec``'s mesh (the process group is up, of the mesh's world
    size): traced at 2 and 3 blocks and extrapolated to the model's ``n_layer`` (a pp mesh: to
    its stage's blocks, with the pipeline's formulas; see the module doc)."""
    from gputui.train import parallelize as par

    shape = MeshShape(**spec["mesh"])
    m = spec["model"]
    formula: list[str] = []
    blocks = m["n_layer"]
    if shape.pp > 1:
        v = stages_per_rank(spec["schedule"], spec.get("stages_per_rank", 2))
        blocks = max(1, m["n_layer"] // (shape.pp * v)) * v
        formula.append("pp: one stage traced; micro-batches in flight, the bubble and the "
                       "stage-to-stage sends are formulas")
    chunks = spec["micro_batches"]
    # torch's trackers take one forward per step: one micro-batch is traced, the others
    # are the same work again (formula)
    trace_spec = dict(spec, micro_batches=1)
    inner = shape
    mesh = par.build_mesh("cpu", shape)
    if not fake and shape.pp > 1:
        return measure_pipeline(spec, mesh, spec.get("steps", 3))
    if not fake:
        got = trace_stack(dict(spec, micro_batches=chunks if shape.pp == 1 else 1), blocks,
                          mesh, fake=False, steps=spec.get("steps", 3))
        got["mem"].pop("at_backward", None)  # the tracker's peak of a real step is above it
        return got
    depth = 1 if blocks == 1 else 2  # see the module doc: not from a lone block
    one = trace_stack(trace_spec, depth, mesh)
    two = trace_stack(trace_spec, depth + 1, mesh)
    out = _extrapolate(one, two, blocks, depth)
    if m.get("moe_experts"):
        formula.append("moe: the router's choices are not on fake tensors; tokens routed "
                       "evenly over the experts, kept by the capacity rule")
    if chunks > 1:
        out = _micro_batches(out, chunks, formula)
    if inner.data_parallel == "ddp":
        out = _ddp(inner, out, formula)
    if shape.pp > 1:
        out = _pipeline(spec, shape, out, blocks)
    out["mem"].pop("at_backward", None)
    out["formula"] = formula
    return out


def measure_pipeline(spec: dict[str, Any], mesh: Any, steps: int) -> dict[str, Any]:
    """A pp mesh run for real (gloo ranks, real tensors; the measured side): the whole GPT
    cut into this rank's stages by the run's own code (:func:`gputui.train.pipeline.apply_pp`),
    the other dimensions applied to each stage, the schedule built and stepped with all its
    micro-batches under torch's memory tracker, as a run steps it. Rank 0's figures: the
    tracker's peak of the last step, its FLOPs and its median step time."""

    from gputui.core.config import from_dict
    from gputui.train import parallelize as par
    from gputui.train.gpt import GPTShape, gpt, lm_loss
    from gputui.train.pipeline import apply_pp
    from gputui.train.strategies.meter import Meter

    m, shape = spec["model"], MeshShape(**spec["mesh"])
    chunks = spec["micro_batches"]
    cfg = from_dict({"model": {"name": "gpt", "n_layer": m["n_layer"], "n_head": m["n_head"],
                               "n_embd": m["n_embd"], "tie": m["tie"]},
                     "data": {"context": m["context"]},
                     "strategy": {"name": "mesh", "schedule": spec["schedule"],
                                  "stages_per_rank": spec["stages_per_rank"],
                                  "pipeline_chunks": chunks}}, "the plan's pp mesh")
    torch.manual_seed(0)
    whole = gpt(GPTShape(vocab_size=m["vocab"], context=m["context"], n_layer=m["n_layer"],
                         n_head=m["n_head"], n_embd=m["n_embd"], tie=m["tie"]))
    names = list(mesh.mesh_dim_names or ())
    lines = mesh.mesh.movedim(names.index("pp"), -1).reshape(-1, shape.pp).tolist()
    peers = next(line for line in lines if dist.get_rank() in line)
    cpu = torch.device("cpu")
    pipe = apply_pp(whole, cfg, "gpt", mesh["pp"].get_local_rank(), peers, lines, cpu,
                    Meter([cpu]))
    for module in pipe.modules:
        par.parallelize(module, mesh, shape, [])
    pp_group = mesh["pp"].get_group() if shape.pp != shape.world else None
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec["precision"])

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return lm_loss(out, y) / chunks

    pipe.build(loss_fn, pp_group, pipe.modules)
    params = [p for module in pipe.modules for p in module.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    # torch's trackers hook every module's backward, which the schedule's own backward
    # (torch.autograd.grad per stage) refuses: the bytes of every live storage instead
    live = LiveBytes()
    live.hold(params, opt)
    rows = spec["micro_batch"] * chunks
    x = torch.randint(0, m["vocab"], (rows, m["context"]))
    y = torch.randint(0, m["vocab"], (rows, m["context"]))
    flops = flop_counter()

    def step() -> None:
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            pipe.step(x, y, 1)
        opt.step()
        opt.zero_grad()

    for _ in range(steps):
        live.hold(params, opt)
        live.peak = live.now  # the last step's peak, with the state the first one made
        with live:
            step()
    # FLOPs on a step of their own, not the measured one (as trace_stack keeps them apart);
    # not the first: a rank of the schedule failed its first step under the counter
    with flops:
        step()
    state = _state_bytes(opt)
    held = sum(p.numel() * p.element_size() for p in params)
    out = {"params": held, "gathered": 0, "grads": 0, "optim": state, "activations": 0,
           "temps": 0, "buffers": 0, "peak": live.peak}
    times = []
    for _ in range(int(spec.get("timed_steps", 4))):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"mem": out, "flops": int(flops.get_total_flops()), "comm": [],
            "seconds": sorted(times)[len(times) // 2],
            "local_params": int(sum(p.numel() for p in params))}


class LiveBytes(TorchDispatchMode):
    """The bytes of every storage alive, counted as ops make them and as they are freed
    (``peak``: the most at once): what a memory tracker's total is, without its module
    hooks. ``hold`` counts what exists already (parameters, gradients, optimizer state).
    A storage is counted at the size it is first seen: fully_shard's all-gather buffers,
    resized to nothing after use and back, count all step (above the real peak)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0
        self.seen: dict[int, Any] = {}

    def _add(self, t: torch.Tensor) -> None:
        import weakref

        storage = t.untyped_storage()
        key = storage._cdata  # the storage itself (its data pointer warns, and moves)
        if key in self.seen or storage.nbytes() == 0:
            return
        n = storage.nbytes()
        self.now += n
        self.peak = max(self.peak, self.now)

        def gone(key: int = key, n: int = n) -> None:
            if self.seen.pop(key, None) is not None:
                self.now -= n

        self.seen[key] = weakref.finalize(storage, gone)

    def hold(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> None:
        for p in params:
            for t in (p, p.grad):
                if isinstance(t, torch.Tensor):
                    self._add(getattr(t, "_local_tensor", t))
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    self._add(getattr(v, "_local_tensor", v))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):  # desugared first: its local ops come back here
            return NotImplemented
        res = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(res):
            if isinstance(t, torch.Tensor) and not hasattr(t, "_local_tensor"):
                self._add(t)
        return res


def _micro_batches(out: dict[str, Any], chunks: int, formula: list[str]) -> dict[str, Any]:
    """A step of ``chunks`` micro-batches from one traced: FLOPs and the forward and backward
    collectives times ``chunks``; the gradients accumulated between them added to the peak."""
    out = dict(out, flops=out["flops"] * chunks)
    if "step" in out.get("work", {}):  # the forward and backward's work again a micro-batch
        out["work"] = dict(out["work"], step={k: v * chunks
                                              for k, v in out["work"]["step"].items()})
    out["comm"] = [dict(c, count=c["count"] * chunks, bytes=c["bytes"] * chunks)
                   if c["phase"] != "optimizer" else c for c in out["comm"]]
    mem = dict(out["mem"])
    # the gradients accumulated between micro-batches: the (sharded) parameters' size, less
    # what the tracker saw at the peak (a few bytes of gradients there once skipped it all)
    kept = max(0, mem["params"] - mem["grads"])
    mem["grads"] += kept
    mem["peak"] += kept
    out["mem"] = mem
    formula.append(f"micro-batches: one of {chunks} traced; FLOPs and collectives x {chunks}, "
                   f"the gradients kept between them added")
    return out


DDP_BUCKET = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb


def _ddp(shape: MeshShape, out: dict[str, Any], formula: list[str]) -> dict[str, Any]:
    """DDP (and ZeRO-1) from a trace of the model without it: DistributedDataParallel does not
    construct on fake tensors (it broadcasts real storage), so its bucketed all-reduce of the
    gradients (in place: gradient_as_bucket_view) and ZeRO-1's sharded optimizer state and
    parameter broadcast are formulas."""
    # the buckets hold every gradient of the rank, the parameters' bytes, all step: not the
    # few gradients the tracker saw at the peak (at GPT-2 small: 6 KiB, the all-reduce's
    # bytes until this was so)
    # (ep's experts are not DDP's: their gradients are reduced apart, traced)
    grads = max(out["mem"]["params"], out["local_params"] * 4) - \
        out.get("expert_params", 0) * 4
    group = shape.dp * shape.cp  # the cp ranks average gradients with the dp ones
    mem = dict(out["mem"])  # the buckets (the gradients: gradient_as_bucket_view) are
    added = grads - mem["grads"]  # allocated with DDP, before the first backward
    mem["grads"] += added
    # held at every moment: where the traced peak is in the optimizer step (the gradients
    # there already; AdamW's multi-tensor temporaries), the moment backward begins, with
    # the buckets, can be the higher
    at_backward = mem.get("at_backward", 0) + grads
    mem["peak"] = max(mem["peak"] + added, at_backward)
    out["mem"] = mem
    out["comm"] = out["comm"] + [{"kind": "all-reduce", "phase": "backward", "group": group,
                                  "count": max(1, -(-grads // DDP_BUCKET)), "bytes": grads,
                                  "formula": True}]
    formula.append("ddp: DistributedDataParallel does not construct on fake tensors; its "
                   "bucketed all-reduce of the gradients is a formula")
    if shape.dp_shard > 1:  # ZeRO-1: ZeroRedundancyOptimizer over the dp_shard ranks
        saved = mem["optim"] - mem["optim"] // shape.dp_shard
        mem["optim"] -= saved
        mem["peak"] -= saved
        out["mem"] = mem
        # each rank updates its partition only: its share of the update's bytes and, per
        # tensor as a CPU plan traces it, of its operations (a GPU plan prices neither)
        if "optimizer" in out.get("work", {}):
            out["work"] = dict(out["work"], optimizer={
                k: v // shape.dp_shard for k, v in out["work"]["optimizer"].items()})
        # each parameter broadcast from the rank that updated it, one call a tensor (torch's
        # default, no bucket view; each call's latency counts), not one call a rank
        out["comm"].append({"kind": "broadcast", "phase": "optimizer", "group": shape.dp_shard,
                            "count": out["param_tensors"],
                            "bytes": out["local_params"] * 4, "formula": True})
        formula.append("zero 1: the optimizer state and update over dp_shard and the "
                       "parameters' broadcast are formulas")
    return out


def _pipeline(spec: dict[str, Any], shape: MeshShape, out: dict[str, Any],
              blocks: int) -> dict[str, Any]:
    """A pp stage's figures from its traced stack (one micro-batch): the activations of the
    micro-batches a schedule keeps in flight (gpipe: all; 1f1b and the others: up to pp), the
    sends of each micro-batch's activation and gradient (formula)."""
    m = spec["model"]
    chunks = spec["micro_batches"]
    in_flight = chunks if spec["schedule"] in ("gpipe", "looped_bfs") else min(chunks, shape.pp)
    mem = dict(out["mem"])
    act = mem["activations"]
    mem["activations"] = act * in_flight
    mem["peak"] += act * (in_flight - 1)
    width = 2 if spec["precision"] in ("bf16", "fp16") else 4
    edge = spec["micro_batch"] * m["context"] * m["n_embd"] * width
    out["comm"] = out["comm"] + [
        {"kind": "send", "phase": "forward", "group": 2, "count": chunks, "bytes": edge * chunks,
         "formula": True},
        {"kind": "send", "phase": "backward", "group": 2, "count": chunks,
         "bytes": edge * chunks, "formula": True}]
    out["mem"] = mem
    out["in_flight"] = in_flight
    return out


def _init_fake(world: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def _traced(spec: dict[str, Any]) -> dict[str, Any]:
    """plan_rank on the fake group of the spec's world; once more on a fresh group when the
    first try fails (a group that earlier meshes split into sub-groups has failed a later
    mesh's tp once, where a fresh one traced it)."""
    # what survives a collection before the job (torch's modules, the caches) is left out of
    # every later collection: each trace's then looks only at what was made since (a full
    # collection walked all of torch's objects, 0.2 CPU-s a trace); frozen before the job's
    # mesh and traces, which are garbage once the job is done
    gc.collect()
    gc.freeze()
    _init_fake(spec["world"])
    try:
        return plan_rank(spec)
    except Exception:  # noqa: BLE001 - the second try's error is the one reported
        dist.destroy_process_group()
        _init_fake(spec["world"])
        return plan_rank(spec)


def _cpu_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """This CPU's matmul FLOP/s at ``spec["threads"]`` (kept per machine by flops.py) and,
    after it (one at a time: each alone on the machine), its cost of an operation's dispatch
    (``spec["ops"]``, :func:`_cpu_ops`). Not kept by the plan where other processes used the
    machine meanwhile ("keep": measured again by the next plan, as flops.py measures such a
    peak again)."""
    from gputui.hw.contention import LoadWatch
    from gputui.train.flops import device_peak

    watch = LoadWatch()
    torch.set_num_threads(int(spec["threads"]))
    try:
        flops, source = device_peak(torch.device("cpu"), spec["dtype"])
    finally:
        torch.set_num_threads(1)
    out: dict[str, Any] = {"flops": flops, "source": source}
    failed = False
    if "ops" in spec:
        try:
            out["ops"] = _cpu_ops(spec["ops"])
        except Exception as exc:  # noqa: BLE001 - the plan then prices FLOPs only, and says so
            out["ops"] = {"error": brief(fault_line(exc), 200)}
            failed = True
    contended = bool(watch.state()["contended"])
    if "ops" in out and not failed:
        out["ops"]["contended"] = contended
    out["keep"] = not contended and not failed  # a failure is measured again, not kept
    return out


def _cpu_ops(spec: dict[str, Any]) -> dict[str, Any]:
    """This CPU's cost of an operation's dispatch at ``spec["threads"]``: ``spec["plain"]``
    and ``spec["dtensor"]`` (a tiny GPT, one rank and tp 2: the same work with no DTensor and
    with DTensors) run for real (real tensors; a fake group, so no collective waits), each the
    median of ``spec["tries"]`` measurements. A plain op's cost: the plain step's time over
    its operations (at this size a step is nearly all dispatch); a DTensor op's: what the
    tp step takes beyond its plain operations, over its DTensor operations. Beside them, a
    written byte's (``byte_s``: :func:`_byte_s`, elementwise operations into tensors of
    ``spec["bytes"]``)."""
    torch.set_num_threads(int(spec["threads"]))
    try:
        got = {}
        for name in ("plain", "dtensor"):
            one = spec[name]
            _init_fake(one["world"])
            tries = [plan_rank(one, fake=False) for _ in range(int(spec.get("tries", 3)))]
            got[name] = sorted(tries, key=lambda t: t["seconds"])[len(tries) // 2]
    finally:
        torch.set_num_threads(1)

    def ops(w: dict[str, Any], kind: str) -> int:  # every phase together
        return sum(int(phase.get(kind, 0)) for phase in w["work"].values())

    plain_ops = ops(got["plain"], "ops")
    tp = got["dtensor"]
    tp_ops, tp_dtensor_ops = ops(tp, "ops"), ops(tp, "dtensor_ops")
    plain = got["plain"]["seconds"] / max(1, plain_ops)
    extra = tp["seconds"] - tp_ops * plain
    return {"op_s": plain, "dtensor_op_s": max(0.0, extra) / max(1, tp_dtensor_ops),
            "byte_s": _byte_s(int(spec["threads"]), int(spec["bytes"])),
            "plain_step_s": got["plain"]["seconds"], "tp_step_s": tp["seconds"],
            "plain_ops": plain_ops, "tp_ops": tp_ops, "tp_dtensor_ops": tp_dtensor_ops}


def _byte_s(threads: int, size: int, tries: int = 7) -> float:
    """This CPU's seconds a byte written by an operation without a FLOP formula, at
    ``threads``: the median of ``tries`` timings of elementwise products, sums and GELUs
    into new tensors of ``size`` bytes, each over its output's bytes. At one thread here
    (2026-11-29, idle) a MiB took 0.07-0.08 ms from 256 KiB to 4 MiB outputs (the sizes
    bench_plan's steps write: 80-100 % of their bytes); in a fresh process only the first
    pass of 48 such operations is slower (0.17-0.21 ms a MiB: its first 4 MiB tensors mapped
    anew), and the median is past it. The plan's child once read 0.10-0.13 (unexplained:
    other work beside it is the likeliest). 0.11 at 64 KiB (the dispatch's share), 0.15
    at 16 MiB and 0.6 at 64 MiB (streamed from memory, its pages touched anew): a model whose
    tensors are that large is priced low on a CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = max(1, size // 4)
        a = torch.full((n,), 0.5)  # any values: the same work (no random draw taken)
        b = torch.full((n,), 0.25)
        ops = (lambda: a * b, lambda: a + b, lambda: torch.nn.functional.gelu(a))
        for op in ops:  # first touches: the allocator's blocks made
            op()
        times = []
        for _ in range(max(1, tries)):
            t0 = time.perf_counter()
            for _ in range(16):
                for op in ops:
                    op()
            times.append((time.perf_counter() - t0) / (16 * len(ops) * n * 4))
        return sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(before)


def measure_rank(rank: int, world: int, port: int, spec: dict[str, Any], threads: int,
                 q: Any) -> None:
    """Spawned entry point of one rank of a real gloo group measuring ``spec``'s mesh on real
    tensors (the benchmark's and the tests' measured side): rank 0 puts its figures. A list
    of specs (of one world) is measured in turn in the one group: a list of figures."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        got: Any = [plan_rank(one, fake=False) for one in spec] if isinstance(spec, list) \
            else plan_rank(spec, fake=False)
        if rank == 0:
            q.put(got)
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        if rank == 0:
            q.put({"error": f"{type(exc).__name__}: {exc}"})

    finally:
        # the run's teardown (a rank measuring ZeRO-1's broadcasts with a plain destroy once
        # printed gloo's "terminate called without an active exception", its figures sent);
        # imported here: the tracing children need none of the run's strategy
        from gputui.train.strategies.rank import destroy_group

        destroy_group()


def _one(job: dict[str, Any]) -> dict[str, Any]:
    try:
        if job.get("kind") == "cpu_profile":
            return _cpu_profile(job["spec"])
        return _traced(job["spec"])
    except Exception as exc:  # one mesh that does not trace is that row's reason
        return {"error": brief(fault_line(exc), 200)}


def serve(jobs: Any, queue: Any, index: int) -> None:
    """Spawned entry point of tracing child ``index``: take jobs (``{"key", "spec",
    "label"}``) from ``jobs`` until a None, putting ("start", index, key, label) as each
    starts and ("result", key, figures | {"error"}) as each ends."""
    torch.set_num_threads(1)
    # torch's own notice to its developers (a cp mesh's sliced flattened dim, torch 2.13),
    # written over the plan's progress otherwise: nothing a user of the plan can act on
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    try:
        while (job := jobs.get()) is not None:
            queue.put(("start", index, job["key"], job["label"]))
            queue.put(("result", job["key"], _one(job)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
