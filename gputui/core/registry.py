"""The strategy registry: what each strategy is, before anything is imported.

This module is torch-free, so the CLI and the TUI can list strategies without importing torch.
It only describes them: whether a strategy can run with a config on some devices is
``gputui.plan.why_not``'s to say (every rule in one place). ``gputui.train.strategies.load``
imports the implementation (in the child: the core names no training module).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyInfo:
    """What the CLI, the TUI and ``gputui.plan`` know about a strategy before anything is
    imported."""

    name: str
    description: str
    module: str  # gputui.train.strategies.<module>, holding class ``STRATEGY``
    multiprocess: bool = False  # one process per device, launched through torch elastic
    min_devices: int = 1
    max_devices: int | None = None
    splits_batch: bool = False  # one process splits each batch over its devices (per device)
    weighted: bool = False  # takes strategy.split_weights (a share of each batch per device)


_STRATEGIES: dict[str, StrategyInfo] = {}


def register(info: StrategyInfo) -> StrategyInfo:
    """Add a strategy (each strategy module's metadata lives here, torch-free)."""
    _STRATEGIES[info.name] = info
    return info


def get(name: str) -> StrategyInfo | None:
    """The strategy called ``name``, or None."""
    return _STRATEGIES.get(name)


def names() -> list[str]:
    """Every registered strategy name, in display order."""
    return list(_STRATEGIES)


def all_infos() -> list[StrategyInfo]:
    """Every registered strategy."""
    return list(_STRATEGIES.values())


register(StrategyInfo(
    "single", "One device, plain minibatch SGD: the baseline every other strategy is "
              "measured against.", "single", max_devices=1))
register(StrategyInfo(
    "scratch", "From-scratch allreduce: a parameter copy per device, each batch split, "
               "gradients summed on the first device and copied back.", "scratch",
    splits_batch=True, weighted=True))
register(StrategyInfo(
    "dp", "torch.nn.DataParallel: one process scatters each batch over the GPUs and gathers "
          "on the first (on CPU it runs without replication, and says so).", "data_parallel"))
register(StrategyInfo(
    "model_parallel", "Consecutive layers on different devices, activations moved between "
                      "them; pipeline_chunks > 1 pipelines each batch through the stages.",
    "model_parallel", min_devices=2))
register(StrategyInfo(
    "ddp", "DistributedDataParallel: one process per device (torch elastic launcher, also "
           "across machines), gradients all-reduced during backward.", "rank",
    multiprocess=True, weighted=True))
register(StrategyInfo(
    "fsdp", "Fully sharded data parallel (fully_shard): like ddp, but parameters, gradients and "
            "optimizer state are sharded over the ranks.", "rank",
    multiprocess=True, weighted=True))
register(StrategyInfo(
    "tp", "Tensor parallelism (Megatron style) of the built-in GPT: each block's heads and MLP "
          "width split over the ranks, activations all-reduced, every rank on the whole batch.",
    "rank", multiprocess=True, min_devices=2))
register(StrategyInfo(
    "fsdp_tp", "fsdp x tp on a 2-D mesh: tensor parallelism inside groups of "
               "strategy.tp_size ranks, fully_shard over the groups (4 devices or more).",
    "rank", multiprocess=True, min_devices=2))
register(StrategyInfo(
    "pp", "Pipeline parallel (torch.distributed.pipelining): consecutive blocks as stages on "
          "separate ranks, micro-batches on a GPipe or 1F1B schedule; shows the pipeline "
          "bubble.", "rank", multiprocess=True, min_devices=2))
register(StrategyInfo(
    "cp", "Context parallelism of the built-in GPT: each sequence split zig-zag over the ranks, "
          "attention by a ring of key/value blocks (PyTorch's context_parallel on CUDA), "
          "gradients averaged over the ranks.", "rank", multiprocess=True))
register(StrategyInfo(
    "mesh", "The device mesh the parallel table names: data-parallel replicas and shards "
            "(ZeRO 1, 2 or 3), tensor, context and pipeline parallelism in any combination whose "
            "product is the ranks (HSDP, dp x tp, dp x tp x pp, ...).", "rank",
    multiprocess=True))
