"""Distance from the hardware: FLOPs of one training step and the peak they are measured against.

FLOPs are counted once per run with ``torch.utils.flop_counter.FlopCounterMode`` on a copy of
the model built on the ``meta`` device (no memory, no arithmetic, no effect on the run's
random state or gradients): one forward and backward of a global batch, the cross-entropy
included. Only the operations torch's counter knows are counted (matrix products and
convolutions, which are nearly all of a network's arithmetic).

The peak is dense FLOP/s for the dtype the matrix products run in: from :data:`PEAK_TFLOPS`
for the GPUs it lists (by the name NVML and CUDA report), else measured here with a short
square matmul and cached per machine in gputui's cache folder (``peak_flops.json``), each
entry with when, where and under what load it was measured (``gputui.hw.contention``). An
entry is measured again when it is not trusted: measured under contention, from an older
cache without that state, or contradicting another (more CPU threads slower than fewer).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from gputui.core.cachedir import KeptFigures, cache_dir

# dense (not sparse) peak TFLOP/s from the vendors' data sheets: (name words, {dtype: peak});
# the first entry whose words all appear in the device name wins, so the narrow come first.
PEAK_TFLOPS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("H100", "PCIE"), {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (("H100", "NVL"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0}),
    (("H100",), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),  # SXM
    (("H200", "NVL"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0}),
    (("H200",), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),  # SXM
    (("A100",), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (("L40S",), {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0}),
    (("L4",), {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (("A10",), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (("V100", "PCIE"), {"fp32": 14.0, "fp16": 112.0}),
    (("V100",), {"fp32": 15.7, "fp16": 125.0}),
    (("T4",), {"fp32": 8.1, "fp16": 65.0}),
)
CACHE_NAME = "peak_flops.json"
MEASURE_S = 0.2  # how long the matmul peak is measured


def counter(modules: bool = True) -> Any:
    """torch's ``FlopCounterMode`` (not displayed) that also counts the CPU's attention kernel.
    ``modules=False``: the step's total only (``get_total_flops``) by the same formulas,
    counted inside the step whose memory the plan's tracer traces without changing it
    (:class:`_WholeStep`): torch's counter tracks modules, hooking every module's backward
    (which kept a checkpointed block's recomputed tensors alive), and runs an operation it has
    no formula for as its decomposition (other temporaries than the step makes).

    torch's counter has formulas for the GPU's attention kernels (flash, memory-efficient,
    cuDNN) and none for ``_scaled_dot_product_flash_attention_for_cpu``, which
    ``scaled_dot_product_attention`` takes on CPU tensors, real or fake: without this, a model
    traced on the CPU (``gputui plan``) has its attention's products counted as zero. Counted
    as model FLOPs, as :func:`count_step_flops` counts them on the meta device (where attention
    runs as two matrix products): the two products forward and four backward (torch's formula
    for the GPU's flash backward adds the recomputed scores, a fifth)."""
    from torch.utils import flop_counter as fc

    def forward(q, k, v, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(q, k, v)

    def backward(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
        return 2 * fc.sdpa_flop_count(q, k, v)

    aten = torch.ops.aten
    mapping: dict[Any, Callable[..., int]] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = forward
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = backward
    mode = fc.FlopCounterMode(display=False, custom_mapping=mapping)
    return mode if modules else _WholeStep(mode.flop_registry)


def _local(x: Any) -> Any:
    """A DTensor's local part (what this rank computes on); anything else as it is."""
    local = getattr(x, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else x


# operations that allocate or change a tensor's metadata only (no byte read or written)
NO_TRAFFIC = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                        "new_empty_strided", "set_", "resize_", "resize_as_"})


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors of an argument or a result (a tensor, or a list or tuple of them), a
    DTensor's local part for a DTensor: a shallow walk, as an operation's arguments are."""
    if isinstance(x, torch.Tensor):
        return [_local(x)]
    if isinstance(x, (list, tuple)):
        return [_local(t) for t in x if isinstance(t, torch.Tensor)]
    return []


# whether two tensors share memory (torch's own test; not in its type stubs)
_ALIAS_OF: Callable[[torch.Tensor, torch.Tensor], bool] = (
    torch._C._is_alias_of)  # type: ignore[attr-defined]


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def written_bytes(func: Any, args: Any, kwargs: Any, out: Any) -> int:
    """The bytes an operation without a FLOP formula writes: the arguments its schema says
    it writes (in-place and ``out=`` operations, and those that return nothing: foreach
    updates, fully_shard's copies out of its all-gather), else its results that are new
    memory (not an alias of an input: ``_unsafe_view``, ``lift_fresh``); a DTensor's local
    part. None for a view, a metadata change (``unsqueeze_``, ``set_``) or an allocation.
    fully_shard's ``all_gather_copy_in`` writes its shard into the all-gather's buffer
    without its schema saying so: the shard's bytes."""
    name = func._overloadpacket.__name__
    if func.is_view or name in NO_TRAFFIC or torch.Tag.inplace_view in func.tags:
        return 0
    if name == "all_gather_copy_in":  # (its buffer's shard, the buffer): the shard written
        return _nbytes(_tensors(out)[:1])
    schema = func._schema
    if schema.is_mutable:
        total = 0
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) else (kwargs or {}).get(arg.name)
                total += _nbytes(_tensors(value))
        return total
    results = _tensors(out) if isinstance(out, torch.Tensor) else [
        t for item in (out if isinstance(out, (list, tuple)) else ())
        for t in _tensors(item)]
    if not results:
        return 0
    inputs = [t for a in (*args, *(kwargs or {}).values()) for t in _tensors(a)]
    return _nbytes([t for t in results
                    if not any(_ALIAS_OF(t, i) for i in inputs)])


# operations not counted as the host's work: metadata queries that fake tensors dispatch and
# real ones answer in C++ (``prim.device``: 1,338 of a tiny GPT's 1,905 traced operations),
# and collectives (priced apart, and wrapped differently on fake and real groups)
UNCOUNTED = frozenset({"prim", "_c10d_functional", "c10d", "c10d_functional"})


class _WholeStep(TorchDispatchMode):
    """The step's FLOPs by torch's counter's formulas (``registry``: its ``flop_registry``),
    each operation counted as it is dispatched and then run as it is: no module tracking and
    no decomposition of the operations the formulas do not know (torch's counter runs those
    as their parts, and so made other temporaries than the step makes). An operation on
    DTensors is counted on their local parts: this rank's share of a tensor-parallel linear
    (torch's counter sees the global shapes), and a replicated one whole.

    Beside the FLOPs, the operations themselves (each costs the host its dispatch, whatever
    its size: the plan's CPU time model prices them, ``gputui.runs.forecast.estimate``), kept
    by ``phase`` (set by the caller): ``ops``, those on plain tensors, and ``dtensor_ops``,
    those on DTensors (each through DTensor's dispatch: its sharding rule, its local
    operation and the result wrapped again; about ten times a plain one's cost here); and
    ``bytes``, what the operations without a FLOP formula write (:func:`written_bytes`: the
    elementwise work, softmax merges, copies; a CPU core streams them at its memory's pace,
    and some meshes make far more of them per FLOP than others: cp 2's ring merges its
    partial attentions, 44 MiB a GFLOP here against one rank's 12.5)."""

    def __init__(self, registry: dict[Any, Callable[..., int]]) -> None:
        super().__init__()
        self.registry, self.total = registry, 0
        self.phase = "step"
        self.work: dict[str, dict[str, int]] = {}
        from torch.distributed.tensor import DTensor

        self.dtensor = DTensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace not in UNCOUNTED:
            work = self.work.setdefault(self.phase, {"ops": 0, "dtensor_ops": 0, "bytes": 0})
            # ``types``: the tensor subclasses among the arguments (torch's own list)
            dtensor = any(issubclass(t, self.dtensor) for t in types)
            work["dtensor_ops" if dtensor else "ops"] += 1
            if func._overloadpacket not in self.registry:
                work["bytes"] += written_bytes(func, args, kwargs, out)
        count = self.registry.get(func._overloadpacket)
        if count is not None:  # a DTensor's op counted on this rank's part of it
            local_args, local_kwargs, local_out = tree_map(_local, (args, kwargs, out))
            self.total += int(count(*local_args, **local_kwargs, out_val=local_out))
        return out

    def get_total_flops(self) -> int:
        return self.total


def count_step_flops(build: Callable[[], nn.Module], x_shape: tuple, num_classes: int,
                     channels_last: bool = False, task: str = "classify") -> int:
    """FLOPs of one forward and backward (mean cross-entropy) of a batch of ``x_shape`` on the
    model ``build()`` makes, counted on the meta device. Random states are left as they were.
    For ``task = "lm"`` the batch is token windows (int64 ``[B, T]``) with next-token targets;
    the count then includes attention's products (``scaled_dot_product_attention``), which
    ``lm_step_flops``'s closed form approximates."""
    from gputui.train.task import mean_loss

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build()
    if task == "lm":
        x = torch.zeros(x_shape, dtype=torch.long, device="meta")
        y = torch.zeros(x_shape, dtype=torch.long, device="meta")
    else:
        x = torch.empty(x_shape, device="meta")
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.zeros(x_shape[0], dtype=torch.long, device="meta") % max(num_classes, 1)
    with counter() as count:
        mean_loss(model(x), y).backward()
    return int(count.get_total_flops())


def moe_params(build: Callable[[], nn.Module], top_k: int) -> tuple[int, int]:
    """A mixture-of-experts model's parameters: (all of them, those one token uses: the
    router and ``top_k`` of each layer's experts besides every dense parameter), counted on
    the meta device. What its FLOPs count is the second: MFU over all the parameters would
    credit work no token does."""
    from gputui.train.moe import layers

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build()
    total = sum(p.numel() for p in model.parameters())
    idle = sum(p.numel() * (layer.n_experts - top_k) // layer.n_experts
               for layer in layers(model) for p in layer.experts.parameters())
    return total, total - idle


def lm_step_flops(params: int, n_layer: int, n_embd: int, context: int, tokens: int) -> int:
    """The usual closed form of a decoder's training FLOPs (Kaplan et al., PaLM's appendix):
    6 per parameter per token (forward 2, backward 4) plus attention's scores and weighted
    sum, 12 x n_layer x n_embd x context per token over the full (unmasked) square. Embedding
    lookups do no multiplications but their weight, tied to the head, is counted there."""
    return 6 * params * tokens + 12 * n_layer * n_embd * context * tokens


def matmul_dtype(precision: str, device: torch.device) -> str:
    """The dtype the matrix products run in: bf16/fp16 under autocast, else tf32 where CUDA
    is allowed to use it for float32, else fp32."""
    if precision in ("bf16", "fp16"):
        return precision
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "fp32"


def table_peak(name: str, dtype: str) -> float | None:
    """FLOP/s from :data:`PEAK_TFLOPS` for a device name, or None when it is not listed."""
    upper = name.upper()
    for words, peaks in PEAK_TFLOPS:
        if all(w in upper for w in words):
            value = peaks.get(dtype)
            return value * 1e12 if value is not None else None
    return None


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_path() -> Path:
    """The kept peaks, in gputui's one cache folder (``gputui.core.cachedir``)."""
    return cache_dir() / CACHE_NAME


def measure_matmul(device: torch.device, dtype: str, seconds: float = MEASURE_S) -> float:
    """FLOP/s of repeated square matmuls in ``dtype`` on ``device`` for about ``seconds``."""
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    n = 4096 if device.type == "cuda" else 512
    # from a generator of its own: drawing from the global one would shift the run's dropout
    # masks by whether the peak was kept from an earlier run (same seed, another run)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen).to(tdtype)
    b = torch.randn(n, n, device=device, generator=gen).to(tdtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    torch.mm(a, b)  # warm-up
    sync(device)
    count, t0 = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        count += 1
        if count % 4 == 0:
            sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                return 2.0 * n ** 3 * count / elapsed


def device_peak(device: torch.device, dtype: str) -> tuple[float, str]:
    """(peak FLOP/s of one device, where it comes from). A listed GPU comes from the table;
    anything else is measured once and cached per machine (per CPU thread count on the CPU)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = table_peak(name, dtype)
        if peak is not None:
            return peak, f"{name}, data sheet"
        key = f"cuda|{name}|{dtype}"
    else:
        name = cpu_name()
        key = f"cpu|{name}|{dtype}|threads={torch.get_num_threads()}"
    return _cached(key, lambda: measure_matmul(device, dtype)), f"{name}, measured matmul"


def _cached(key: str, measure: Callable[[], float]) -> float:
    kept = KeptFigures(path=cache_path())
    why = distrust(kept.data, key)
    if why is None:
        return float(kept.data[key]["flops"])
    for k in contradicting(kept.data, key):
        kept.drop(k)  # both sides of a contradiction are measured again
    from gputui.hw.contention import LoadWatch

    watch = LoadWatch()
    value = measure()
    try:
        kept.put(key, {"flops": value, "machine": watch.state(), "remeasured": why})
    except OSError:  # a read-only cache (WriteFailed is one): measured again next time
        pass
    return value


def distrust(data: dict[str, Any], key: str) -> str | None:
    """Why the cached peak ``key`` must be measured again, None when it is trusted."""
    entry = data.get(key)
    if entry is None:
        return "not cached"
    if not isinstance(entry, dict) or not isinstance(entry.get("flops"), (int, float)) \
            or not isinstance(entry.get("machine"), dict):
        return "cached without when, where and under what load it was measured"
    if entry["machine"].get("contended"):
        return "measured while other processes used the machine"
    if contradicting(data, key):
        return "contradicts another entry: more threads measured slower than fewer"
    return None


def _threads(key: str) -> tuple[str, int] | None:
    head, sep, n = key.rpartition("|threads=")
    return (head, int(n)) if sep and n.isdigit() else None


def contradicting(data: dict[str, Any], key: str) -> list[str]:
    """The entries that contradict ``key``'s: the same CPU and dtype, more threads and a
    lower peak or fewer threads and a higher one (a peak cannot fall as threads are added)."""
    me = _threads(key)
    mine = data.get(key)
    if me is None or not isinstance(mine, dict):
        return []
    out = []
    for k, v in data.items():
        other = _threads(k)
        flops = v.get("flops") if isinstance(v, dict) else v
        if k == key or other is None or other[0] != me[0] or \
                not isinstance(flops, (int, float)):
            continue
        if (other[1] > me[1] and flops < mine["flops"]) or \
                (other[1] < me[1] and flops > mine["flops"]):
            out.append(k)
    return out
