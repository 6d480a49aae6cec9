"""The strategy registry: name, one-line description and "can it run here?" for each strategy.

This module is torch-free, so the CLI and the TUI can list strategies and explain why one
cannot run without importing torch. ``StrategyInfo.load()`` imports the implementation.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from gputui.core.config import RunConfig
    from gputui.core.devices import Device


@dataclass(frozen=True)
class StrategyInfo:
    """What the CLI and TUI know about a strategy before anything is imported."""

    name: str
    description: str
    module: str  # gputui.train.strategies.<module>, holding class ``STRATEGY``
    multiprocess: bool = False  # one process per device, launched through torch elastic
    min_devices: int = 1
    max_devices: int | None = None
    check: Callable[["RunConfig", list["Device"]], str | None] | None = None

    def why_not(self, cfg: "RunConfig", devices: list["Device"]) -> str | None:
        """None when the strategy can run with this config on these devices, else the reason."""
        n = len(devices)
        if n < self.min_devices:
            return (f"strategy '{self.name}' needs at least {self.min_devices} devices, "
                    f"devices.spec '{cfg.devices.spec}' gives {n}; e.g. --devices cpu*2")
        if self.max_devices is not None and n > self.max_devices:
            return (f"strategy '{self.name}' uses {self.max_devices} device, devices.spec "
                    f"'{cfg.devices.spec}' gives {n}; use --devices cpu or another strategy")
        if cfg.dist.nnodes > 1 and not self.multiprocess:
            return (f"dist.nnodes = {cfg.dist.nnodes} needs a multi-process strategy (ddp or "
                    f"fsdp), not '{self.name}'")
        return self.check(cfg, devices) if self.check else None

    def load(self) -> type:
        """Import the implementation class (this imports torch)."""
        mod = importlib.import_module(f"gputui.train.strategies.{self.module}")
        return mod.STRATEGY


def _no_split_weights(name: str) -> Callable:
    def check(cfg: "RunConfig", devices: list["Device"]) -> str | None:
        if cfg.strategy.split_weights:
            return (f"strategy.split_weights applies to scratch and ddp, not '{name}'; "
                    f"remove it")
        return None
    return check


def _scratch_check(cfg: "RunConfig", devices: list["Device"]) -> str | None:
    from gputui.core.config_schema import effective_batch_size

    batch = effective_batch_size(cfg, len(devices))
    if batch < len(devices) * cfg.optim.micro_batches:
        return (f"optim.batch_size ({batch}) must give every one of the {len(devices)} devices "
                f"at least one example in each of its optim.micro_batches "
                f"({cfg.optim.micro_batches}); raise the batch size or lower micro_batches")
    return None


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
              "measured against.", "single", max_devices=1, check=_no_split_weights("single")))
register(StrategyInfo(
    "scratch", "From-scratch allreduce: a parameter copy per device, each batch split, "
               "gradients summed on the first device and copied back.", "scratch",
    check=_scratch_check))
register(StrategyInfo(
    "dp", "torch.nn.DataParallel: one process scatters each batch over the GPUs and gathers "
          "on the first (on CPU it runs without replication, and says so).", "data_parallel",
    check=_no_split_weights("dp")))


def _model_parallel_check(cfg: "RunConfig", devices: list["Device"]) -> str | None:
    from gputui.core.mp_plan import registry_check  # torch-free

    return registry_check(cfg, devices)


register(StrategyInfo(
    "model_parallel", "Consecutive layers on different devices, activations moved between "
                      "them; pipeline_chunks > 1 pipelines each batch through the stages.",
    "model_parallel", min_devices=2, check=_model_parallel_check))


def _distributed_check(name: str) -> Callable:
    def check(cfg: "RunConfig", devices: list["Device"]) -> str | None:
        from gputui.core.config_schema import effective_batch_size

        kinds = {d.kind for d in devices}
        if len(kinds) > 1:
            return f"strategy '{name}' needs devices of one kind (all CUDA or all CPU)"
        if cfg.strategy.backend == "nccl" and kinds != {"cuda"}:
            return (f"strategy.backend = 'nccl' needs CUDA devices, devices.spec "
                    f"'{cfg.devices.spec}' gives CPU ones; use 'gloo' or 'auto'")
        host, _, port = cfg.dist.rdzv_endpoint.rpartition(":")
        if cfg.dist.rdzv_endpoint and not (host and port.isdigit() and 0 < int(port) < 65536):
            return (f"dist.rdzv_endpoint must be HOST:PORT, e.g. 10.0.0.1:29400; "
                    f"got {cfg.dist.rdzv_endpoint!r}")
        ranks = len(devices) * cfg.dist.nnodes
        batch = effective_batch_size(cfg, ranks)
        if batch < ranks * cfg.optim.micro_batches:
            return (f"optim.batch_size ({batch}) must give every one of the {ranks} ranks at "
                    f"least one example per micro-batch; raise the batch size")
        return None
    return check


register(StrategyInfo(
    "ddp", "DistributedDataParallel: one process per device (torch elastic launcher, also "
           "across machines), gradients all-reduced during backward.", "ddp",
    multiprocess=True, check=_distributed_check("ddp")))
register(StrategyInfo(
    "fsdp", "Fully sharded data parallel (fully_shard): like ddp, but parameters, gradients and "
            "optimizer state are sharded over the ranks.", "fsdp",
    multiprocess=True, check=_distributed_check("fsdp")))


def _pp_check(cfg: "RunConfig", devices: list["Device"]) -> str | None:
    from gputui.core.mp_plan import pp_check  # torch-free

    return _distributed_check("pp")(cfg, devices) or pp_check(cfg, devices)


register(StrategyInfo(
    "pp", "Pipeline parallel (torch.distributed.pipelining): consecutive blocks as stages on "
          "separate ranks, micro-batches on a GPipe or 1F1B schedule; shows the pipeline "
          "bubble.", "pp", multiprocess=True, min_devices=2, check=_pp_check))
