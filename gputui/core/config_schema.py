"""The preset schema: one frozen dataclass per TOML table, each field documented.

``help`` in a field's metadata is its documentation (the app's field tooltips and its help
line show it); ``choices``, ``min``/``max`` (inclusive), ``gt`` (exclusive) and ``check`` (a
function of the value giving the one-line problem, or None) are the field's own rules, checked
by :mod:`gputui.core.config` when a preset or an override is loaded. The rules that join
several fields, or a field and the devices, are ``gputui.plan.validate``'s, in one place.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


MODELS = ("lenet", "resnet18", "mlp", "gpt")
DATASETS = ("synthetic", "mnist", "fashion-mnist", "cifar10", "pystdlib", "text")
# byte-level language-modelling data (vocab 256): windows of data.context tokens
TEXT_DATASETS = ("pystdlib", "text")
LOSSES = ("cross_entropy", "nll")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
OPTIMIZERS = ("sgd", "adam", "adamw")
# strategy.schedule -> the stages each rank holds: 1, "v" (strategy.stages_per_rank, looped:
# rank r holds r, r + pp, ...) or "V" (two, in a V: rank r holds r and 2 pp - 1 - r)
PP_PLACEMENT: dict[str, int | str] = {
    "gpipe": 1, "1f1b": 1, "interleaved_1f1b": "v", "looped_bfs": "v", "interleaved_zb": "v",
    "zbv": "V", "dualpipev": "V"}
PP_SCHEDULES = tuple(PP_PLACEMENT)
SCHEDULES = ("constant", "cosine", "linear", "step")


def default_data_root() -> str:
    """Where real datasets are looked for: ``$XDG_CACHE_HOME/gputui/data`` (or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "gputui" / "data")


def opt(default: Any, help: str, **checks: Any) -> Any:  # noqa: A002 - mirrors argparse
    """A documented config field; ``checks`` are choices/min/max/gt/check rules, ``items=(type,
    rules)`` the type and min/max/gt rules of each element of a list."""
    meta = {"help": help, **checks}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def path_like(name: str) -> bool:
    """A run name that could point outside the runs folder or hide itself: separators, a
    leading dot or tilde, control characters."""
    return any(c in name for c in "/\\:") or name.startswith((".", "~")) or \
        any(ord(c) < 32 or ord(c) == 127 for c in name)


def _plain_name(name: str) -> str | None:
    if path_like(name):
        return (f"run.name {name!r} looks like a path; use a plain name of letters, digits, "
                f"'-', '_' and '.' (e.g. 'lenet-2dev')")
    return None


# a host name (RFC 1123 labels, "_" tolerated as resolvers do), an IPv4 address, or an IPv6
# address in brackets as torch's rendezvous reads it
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?"
                   r"|\[[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?\]")


def _host_port(endpoint: str) -> str | None:
    host, _, port = endpoint.rpartition(":")
    if endpoint and not (host and port.isdigit() and 0 < int(port) < 65536):
        return f"dist.rdzv_endpoint must be HOST:PORT, e.g. 10.0.0.1:29400; got {endpoint!r}"
    if endpoint and (len(host) > 253 or not _HOST.fullmatch(host)):
        return (f"dist.rdzv_endpoint's host must be a host name or address (letters, digits, "
                f"'-', '.'; an IPv6 address in brackets), e.g. node-a:29400; got {host!r}")
    return None


def _interface(name: str) -> str | None:
    if name and (len(name) > 15 or not all(c.isalnum() or c in "-_.@:" for c in name)):
        return (f"dist.interface must be a network interface name like eth0 or ens5 (see `ip "
                f"addr`); got {name!r}")
    return None


@dataclass(frozen=True)
class RunSection:
    """[run]: what the run is called, how long it trains and how it reports."""

    name: str = opt("run", "Short name used in the run id and the run folder.",
                    check=_plain_name)
    epochs: int = opt(2, "Number of passes over the training set.", min=1, max=100_000)
    seed: int = opt(0, "Seed for parameter init and batch order (same seed, same run).", min=0,
                    max=2**32 - 1)
    log_every: int = opt(20, "Report step metrics every N optimizer steps (the only sync point).",
                         min=1, max=1_000_000_000)
    threads: int = opt(0, "torch intra-op threads per training process; 0 = the cores available "
                          "divided by the number of processes.", min=0, max=1024)
    precision: str = opt("fp32", "Numeric precision: fp32, bf16 autocast (CPU or CUDA) or fp16 "
                                 "autocast with a grad scaler (CUDA only).", choices=PRECISIONS)
    on_divergence: str = opt("stop", "A NaN or infinite loss: 'stop' ends the run as failed "
                                     "(\"diverged at step N\"); 'continue' warns once and "
                                     "trains on.", choices=("stop", "continue"))
    checkpoint: bool = opt(True, "Write checkpoint.pt in the run folder at each epoch end and on "
                                 "a stop, so `gputui resume` can continue the run.")
    checkpoint_every: int = opt(0, "Also checkpoint every N optimizer steps (0 = only at epoch "
                                   "ends and on a stop).", min=0, max=1_000_000_000)
    stop_grace_s: float = opt(30.0, "Seconds a graceful stop (Ctrl-C, SIGTERM, SIGHUP) may take "
                                    "before gputui kills the run instead.", gt=0.0, max=86_400.0)
    resume_from: str = opt("", "A run folder (or checkpoint file) to continue from; set by "
                               "`gputui resume`, empty = start fresh.")
    compile: str = opt("off", "torch.compile the model a step runs: off, default, "
                              "reduce-overhead (CUDA graphs) or max-autotune. Compiling happens "
                              "before the first step and is reported apart (compile_s).",
                       choices=COMPILE_MODES)
    compile_fallback: str = opt("eager", "When compiling fails: 'eager' says so in one line "
                                         "and trains uncompiled; 'fail' stops the run.",
                                choices=("eager", "fail"))
    channels_last: bool = opt(False, "Keep conv weights and images in channels_last memory "
                                     "format (faster convolutions on recent GPUs; no effect on "
                                     "mlp).")


@dataclass(frozen=True)
class ModelSection:
    """[model]: the network and its initialisation."""

    name: str = opt("lenet", "lenet (the material's LeNet variant), resnet18 (its ResNet-18 "
                             "variant), mlp (a small multilayer perceptron) or gpt (a GPT-style "
                             "transformer sized by model.n_layer/n_head/n_embd, for text data); "
                             "model.factory, when set, replaces it.", choices=MODELS)
    factory: str = opt("", "Your own model (this runs your code): 'package.module:function' or "
                           "'path/to/file.py:function', called as function(channels, height, "
                           "width, classes, **model.kwargs) and returning an nn.Module; or "
                           "'torchvision:NAME' (e.g. torchvision:resnet50), adapted to the "
                           "data's channels and classes. Empty = model.name.", code=True)
    kwargs: dict = opt({}, "Keyword arguments passed to model.factory, e.g. "
                           "{ width = 64, depth = 4 }.")
    init: str = opt("normal", "Weight init of the built-in models: 'normal' draws weights from "
                              "N(0, init_std) as the material does; 'default' keeps PyTorch's "
                              "usual init. A model.factory keeps the init its code does.",
                    choices=("normal", "default"))
    init_std: float = opt(0.01, "Standard deviation for init = 'normal'.", gt=0.0, max=10.0)
    n_layer: int = opt(4, "gpt: transformer blocks.", min=1, max=256)
    n_head: int = opt(4, "gpt: attention heads per block (must divide model.n_embd).", min=1,
                      max=256)
    n_embd: int = opt(128, "gpt: embedding width.", min=1, max=65_536)
    tie: bool = opt(True, "gpt: the output head shares the token embedding's weight (GPT-2).")
    moe_experts: int = opt(0, "gpt: experts of a mixture of experts in place of each block's "
                              "MLP (0 = the dense MLP); parallel.ep shards them over ranks.",
                           min=0, max=1024)
    moe_top_k: int = opt(1, "gpt with moe_experts: experts each token is routed to (1 = "
                            "Switch, 2 = GShard/Mixtral).", min=1, max=64)
    moe_capacity_factor: float = opt(1.25, "gpt with moe_experts: each expert takes at most "
                                           "factor x tokens x top_k / experts assignments per "
                                           "forward (tokens of every data-parallel rank); the "
                                           "rest are dropped (passed through the residual) and "
                                           "counted. 0 = no limit.", min=0.0, max=1024.0)
    moe_aux_weight: float = opt(0.01, "gpt with moe_experts: weight of the router's "
                                      "load-balancing loss (Switch's), added to the loss "
                                      "differentiated, not to the loss reported.", min=0.0,
                                max=100.0)
    loss: str = opt("cross_entropy", "The training loss on the model's output: cross_entropy "
                                     "(logits) or nll (a model ending in log_softmax). A forward "
                                     "may return a tensor or an object with .logits "
                                     "(HuggingFace style).", choices=LOSSES)

    @property
    def label(self) -> str:
        """The model as records and tables name it: the factory when set, else the name."""
        return self.factory or self.name


@dataclass(frozen=True)
class DataSection:
    """[data]: the dataset and how it is fed."""

    name: str = opt("synthetic", "synthetic (generated, embedded), mnist, fashion-mnist or "
                                 "cifar10 (read from data.root): images to classify; pystdlib "
                                 "(this Python's standard library source, no download) or text "
                                 "(the file or folder data.path names): bytes for language "
                                 "modelling. data.factory, when set, replaces it.",
                      choices=DATASETS)
    factory: str = opt("", "Your own data (this runs your code): 'package.module:function' or "
                           "'path/to/file.py:function', called as function(**data.kwargs) and "
                           "returning (train, test), each an (images, labels) pair of tensors "
                           "or a torch Dataset of (image, label); or 'imagefolder:PATH', a "
                           "folder holding train/ and test/ in torchvision's ImageFolder "
                           "layout. Channels, size and classes are taken from the data. "
                           "Empty = data.name.", code=True)
    kwargs: dict = opt({}, "Keyword arguments passed to data.factory, e.g. { n = 2048 }.")
    root: str = opt("", "Folder holding real datasets in torchvision's layout; empty = "
                        "the user cache dir (~/.cache/gputui/data).")
    download: bool = opt(False, "Download a missing real dataset into data.root (needs internet).")
    train_size: int = opt(0, "Training examples: for synthetic the number generated (0 = 12000); "
                             "for real data a cap on the split (0 = all); for text the windows "
                             "of data.context tokens (0 = all).", min=0,
                          max=100_000_000)
    test_size: int = opt(0, "Test examples: for synthetic the number generated (0 = 2000); for "
                            "real data a cap (0 = all); for text the validation windows.",
                         min=0, max=100_000_000)
    context: int = opt(128, "Text data: tokens (bytes) per example window; the model predicts "
                            "each next byte.", min=2, max=1_048_576)
    path: str = opt("", "data.name = 'text': a text file, or a folder whose files are read in "
                        "sorted order; its last tenth is the validation split.")
    source: str = opt("standard", "'standard' trains on the train split and tests on the test "
                                  "split; 'test-split' carves both from the test split (for a "
                                  "folder holding only the t10k files).",
                      choices=("standard", "test-split"))
    loader: str = opt("auto", "'tensors' keeps the whole set on the device and indexes it per "
                              "batch; 'dataloader' uses torch's DataLoader; 'auto' picks tensors "
                              "below 2 GiB.", choices=("auto", "tensors", "dataloader"))
    workers: int = opt(0, "DataLoader worker processes (loader = 'dataloader' only).", min=0,
                       max=64)

    @property
    def label(self) -> str:
        """The dataset as records and tables name it: the factory when set, else the name."""
        return self.factory or self.name


def _betas_problem(value: list) -> str | None:
    """Why a betas list is not two numbers in [0, 1), or None."""
    ok = (len(value) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                  and 0.0 <= b < 1.0 for b in value))
    return None if ok else (f"optim.betas must be two numbers in [0, 1), e.g. [0.9, 0.999]; "
                            f"got {value!r}")


@dataclass(frozen=True)
class OptimSection:
    """[optim]: the optimizer, its learning-rate schedule and gradient clipping. The defaults
    are the material's minibatch SGD at a constant lr, unclipped."""

    batch_size: int = opt(256, "Global batch size: the examples of one optimizer step, over all "
                               "devices together.", min=1, max=1_000_000)
    name: str = opt("sgd", "The optimizer: sgd (torch.optim.SGD, with momentum), adam "
                           "(torch.optim.Adam) or adamw (torch.optim.AdamW, decoupled weight "
                           "decay).", choices=OPTIMIZERS)
    lr: float = opt(0.1, "Learning rate: the peak of the schedule (reached at the end of the "
                         "warm-up).", gt=0.0, max=100.0)
    momentum: float = opt(0.0, "sgd: momentum (0 = plain SGD, as the material uses).", min=0.0,
                          max=0.999)
    weight_decay: float = opt(0.0, "Weight decay: an L2 term for sgd and adam, decoupled for "
                                    "adamw (0 = none).", min=0.0, max=1.0)
    betas: list = opt([0.9, 0.999], "adam/adamw: the decay rates of the moving averages of the "
                                     "gradient and of its square, two numbers in [0, 1).",
                      check=_betas_problem)
    eps: float = opt(1e-8, "adam/adamw: the term added to the denominator for stability.",
                     gt=0.0, max=1.0)
    schedule: str = opt("constant", "How the lr changes per optimizer step, after the warm-up: "
                                    "constant, cosine (decay to min_lr_ratio x lr at the run's "
                                    "end), linear (the same, in a straight line) or step "
                                    "(times gamma every step_size steps).", choices=SCHEDULES)
    warmup_steps: int = opt(0, "Optimizer steps of linear warm-up from lr/warmup_steps to lr "
                               "before the schedule (0 = none); fewer than the run's steps.",
                            min=0, max=10_000_000)
    min_lr_ratio: float = opt(0.0, "cosine/linear: the lr at the run's end, as a fraction of "
                                   "lr.", min=0.0, max=1.0)
    step_size: int = opt(1000, "step: optimizer steps between two multiplications by gamma.",
                         min=1, max=10_000_000)
    gamma: float = opt(0.1, "step: the factor applied to the lr every step_size steps.", gt=0.0,
                       max=1.0)
    clip_grad_norm: float = opt(0.0, "Scale the gradients down so their global L2 norm (over "
                                     "every device's shard) is at most this, before each "
                                     "update (0 = no clipping).", min=0.0, max=1e9)
    micro_batches: int = opt(1, "Split each batch into N micro-batches whose gradients are "
                                "accumulated before one update (same update, less memory).",
                             min=1, max=4096)
    scale_with_devices: bool = opt(False, "Multiply batch_size and lr by the number of devices "
                                          "(the material: 256/0.1 on one, 512/0.2 on two).")


@dataclass(frozen=True)
class DevicesSection:
    """[devices]: which devices train."""

    spec: str = opt("cpu", "Devices as users write them: 'cpu', 'cpu*4' (CPU virtual devices), "
                           "indices '0,2', 'all', a count '2', or 'cuda:*'.")
    fallback: str = opt("none", "When the GPUs asked for are not there: 'none' refuses to start, "
                                "'cpu' uses the same number of CPU virtual devices instead.",
                        choices=("none", "cpu"))


@dataclass(frozen=True)
class StrategySection:
    """[strategy]: how the work is spread over the devices."""

    name: str = opt("single", "single, scratch (from-scratch allreduce), dp (DataParallel), ddp, "
                              "model_parallel, fsdp, tp (tensor parallel), fsdp_tp, pp "
                              "(pipeline parallel) or mesh (the degrees of [parallel]); "
                              "`gputui strategies` lists them.")
    check_replicas: bool = opt(False, "scratch: after each step, verify every replica still "
                                      "equals the first (slow; a debugging aid).")
    split_weights: list = opt([], "scratch/ddp: relative share of each batch per device, e.g. "
                                  "[0.8, 0.2] for a faster and a slower device; empty = even.",
                        items=(float, {"gt": 0.0, "max": 1e6}))
    split_points: list = opt([], "model_parallel: indices of the layers where a new stage "
                                 "starts; empty = balanced by parameter count.",
                         items=(int, {"min": 1, "max": 100_000}))
    fsdp_wrap: list = opt([], "fsdp: class names of the modules that get a fully_shard each "
                              "(e.g. ['Block'] for a model.factory's blocks); empty = every "
                              "top-level block with parameters.")
    pipeline_chunks: int = opt(1, "model_parallel and pp: micro-batches that flow through the "
                                  "stages as a pipeline (1 = no pipelining).", min=1, max=1024)
    schedule: str = opt("1f1b", "pp: the pipeline schedule: gpipe (every forward, then every "
                                "backward), 1f1b (one forward, one backward in steady state), "
                                "interleaved_1f1b and looped_bfs (strategy.stages_per_rank "
                                "stages a rank), interleaved_zb, zbv and dualpipev (zero "
                                "bubble: backward split into input and weight gradients; zbv "
                                "and dualpipev place two stages a rank in a V); those this "
                                "torch has.", choices=PP_SCHEDULES)
    stages_per_rank: int = opt(2, "pp: stages each rank holds under interleaved_1f1b, "
                                  "looped_bfs and interleaved_zb (the V schedules hold 2; gpipe "
                                  "and 1f1b 1).", min=1, max=64)
    tp_size: int = opt(0, "fsdp_tp: ranks per tensor-parallel group (the rest of the ranks "
                          "form the data-parallel dimension); 0 = 2.", min=0, max=4096)
    backend: str = opt("auto", "ddp/fsdp/tp/pp process-group backend: auto (nccl on CUDA, gloo on "
                               "CPU), gloo or nccl.", choices=("auto", "gloo", "nccl"))
    timeout_s: float = opt(120.0, "ddp/fsdp: seconds a collective may wait before the run fails.",
                           gt=0.0, max=86_400.0)
    stall_after_s: float = opt(0.0, "ddp/fsdp/tp/pp: seconds without progress in any rank's "
                               "collectives after which the run names the rank that is behind "
                               "and stops (gputui run --stall-after); 0 = from the run's own "
                               "step time (20 x the slowest logged step, at least 60 s); -1 = "
                               "never (the backend's timeout_s alone).", min=-1.0,
                               max=86_400.0)


@dataclass(frozen=True)
class ParallelSection:
    """[parallel]: the device mesh (torchtitan's degrees, whose product is the world size) of
    strategy.name = 'mesh', and the memory levers of every multi-process strategy. The named
    strategies are points of the same mesh: ddp = dp_replicate N, fsdp = dp_shard N, tp = tp N,
    fsdp_tp = dp_shard N/t x tp t, pp = pp N."""

    dp_replicate: int = opt(1, "mesh: data-parallel replicas (gradients all-reduced, every "
                               "replica holding the whole model state).", min=1, max=65536)
    dp_shard: int = opt(-1, "mesh: data-parallel shards (parameters, gradients and optimizer "
                            "state sharded as parallel.zero says); -1 = the ranks the other "
                            "degrees leave.", min=-1, max=65536)
    tp: int = opt(1, "mesh: tensor-parallel degree (each GPT block's heads and MLP width split "
                     "over tp ranks).", min=1, max=65536)
    pp: int = opt(1, "mesh: pipeline-parallel degree (consecutive blocks as stages).", min=1,
                  max=65536)
    cp: int = opt(1, "mesh: context-parallel degree (each sequence split over cp ranks, "
                     "zig-zag; attention by a ring of key/value blocks).", min=1, max=65536)
    ep: int = opt(1, "Expert-parallel degree of a mixture-of-experts GPT (model.moe_experts): "
                     "the experts sharded over groups of ep data-parallel ranks, tokens "
                     "exchanged by all-to-all. Carved from the data-parallel ranks (it does "
                     "not multiply the world); ddp, fsdp and mesh.", min=1, max=65536)
    zero: int = opt(3, "ZeRO stage of the sharded data-parallel dimension: 1 = optimizer state "
                       "sharded, 2 = gradients too (parameters stay gathered from forward to "
                       "backward), 3 = parameters too (fsdp).", choices=(1, 2, 3))
    ac: str = opt("none", "Activation checkpointing of each block: none, full (every block's "
                          "activations recomputed in backward) or selective (the matmuls' "
                          "outputs kept, the rest recomputed).",
                  choices=("none", "full", "selective"))


@dataclass(frozen=True)
class DistSection:
    """[dist]: multi-node ddp/fsdp through a c10d rendezvous (torchrun's engine)."""

    nnodes: int = opt(1, "Number of machines (nodes) in the job.", min=1, max=4096)
    node_rank: int = opt(0, "This machine's rank among the nodes (0 .. nnodes-1).", min=0,
                         max=4095)
    rdzv_endpoint: str = opt("", "HOST:PORT of the c10d rendezvous; empty = a free local port "
                                 "(single node only).", check=_host_port)
    rdzv_id: str = opt("gputui", "Job id shared by every node of one job.")
    interface: str = opt("", "The network interface this machine reaches the other nodes "
                             "through (e.g. eth0): its address is the one given to them (gloo, "
                             "NCCL and the rendezvous use it); empty = the address this "
                             "machine's host name resolves to.", check=_interface)


@dataclass(frozen=True)
class TelemetrySection:
    """[telemetry]: live device sampling while the run trains."""

    enabled: bool = opt(True, "Sample utilization, memory, temperature and power while training.")
    interval_s: float = opt(1.0, "Seconds between samples (at least 0.25).", min=0.25, max=3600.0)


def _strategy_or_empty(name: str) -> str | None:
    from gputui.core import registry

    if name and registry.get(name) is None:
        return f"debug.fault_strategy must be a strategy ({', '.join(registry.names())}) or \"\""
    return None


@dataclass(frozen=True)
class DebugSection:
    """[debug]: knobs that slow a run down on purpose, to see a cost where the step breakdown
    shows it (the tests use them; a run that sets one says so in its log)."""

    comm_delay_s: float = opt(0.0, "Seconds added to every gradient communication: each DDP "
                                   "bucket's all-reduce, scratch's allreduce, each "
                                   "model_parallel transfer (0 = none).", min=0.0, max=60.0)
    data_delay_s: float = opt(0.0, "Seconds added to the wait for every training batch "
                                   "(0 = none).", min=0.0, max=60.0)
    trace_steps: int = opt(0, "Train only this many steps, keeping each one's loss and "
                              "parameters (gathered onto the first rank) in the run folder's "
                              "param_trace.npz: what `gputui verify` runs (0 = off).",
                           min=0, max=10_000)
    fault_strategy: str = opt("", "A strategy broken on purpose: its runs scale every "
                                  "gradient by 1.5 from global step debug.fault_step on, so "
                                  "`gputui verify` can be seen to catch a fault (\"\" = none).",
                              check=_strategy_or_empty)
    fault_step: int = opt(1, "The first global step debug.fault_strategy breaks.", min=1,
                          max=10_000_000)
    slow_rank: int = opt(-1, "For testing straggler attribution: the global rank (ddp, fsdp, "
                             "tp) whose backward debug.slow_backward_ms slows down (-1 = none).",
                         min=-1, max=65535)
    slow_backward_ms: float = opt(0.0, "For testing straggler attribution: milliseconds added "
                                       "to each backward of debug.slow_rank (every step, "
                                       "each micro-batch), before its first gradient "
                                       "(0 = none).",
                                  min=0.0, max=60000.0)


SECTIONS: dict[str, type] = {
    "run": RunSection,
    "model": ModelSection,
    "data": DataSection,
    "optim": OptimSection,
    "devices": DevicesSection,
    "strategy": StrategySection,
    "parallel": ParallelSection,
    "dist": DistSection,
    "telemetry": TelemetrySection,
    "debug": DebugSection,
}


def optimizer_states(optim: OptimSection) -> int:
    """Tensors of optimizer state per parameter: Adam's two moments, SGD's momentum buffer
    (none without momentum). What the memory prediction counts."""
    if optim.name in ("adam", "adamw"):
        return 2
    return 1 if optim.momentum > 0 else 0


def lr_scheduled(optim: OptimSection) -> bool:
    """Whether the lr of a run with these [optim] values changes over the run (a schedule
    other than constant, or a warm-up): the printer and the run screen then show it."""
    return optim.schedule != "constant" or bool(optim.warmup_steps)
