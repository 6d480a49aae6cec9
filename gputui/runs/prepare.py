"""From a config to the devices it runs on, every rule checked: the path every entry takes
before a launch (``gputui run`` and ``resume``, each point of a sweep, the measuring runs of
``predict``, and the app's Start).

Discovery runs once (``gputui.hw.discovery``, only when the spec names GPUs), the config is
checked against the devices it gave (``gputui.plan.validate``), then the disk
(:func:`check_disk`: the files it names and its dataset). The devices, the fallback's note and
the GPUs seen are handed on, so the launch and its warnings ask the hardware no second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputui import plan
from gputui.core.config import (ConfigError, RunConfig, apply_overrides, load_preset,
                                override_origins)
from gputui.core.datafiles import data_problem
from gputui.core.devices import Device, DeviceSpecError, GpuInfo
from gputui.hw.discovery import resolve_with_gpus
from gputui.runs.model_check import CUT_KEYS, cut_problem
from gputui.core.datafiles import text_bytes, text_windows


@dataclass(frozen=True)
class Prepared:
    """A checked config and what it resolved to on this machine."""

    config: RunConfig
    devices: list[Device]
    note: str = ""  # the fallback's one line when CPU devices replaced the spec's GPUs
    gpus: list[GpuInfo] = field(default_factory=list)  # what discovery saw ([]: not asked)


def prepare(cfg: RunConfig, source: str = "config", origins: dict[str, str] | None = None,
            files: bool = True) -> Prepared:
    """Resolve ``cfg``'s devices (discovery once, only when the spec names GPUs), validate,
    then check the disk unless ``files`` is False; raises ConfigError."""
    try:
        devices, note, gpus = resolve_with_gpus(cfg.devices.spec, cfg.devices.fallback)
    except DeviceSpecError as exc:
        raise plan.device_error(exc, source, origins) from None
    plan.validate(cfg, devices, source, origins)
    if files:
        check_disk(cfg, source, origins, devices)
        check_network(cfg)
    return Prepared(cfg, devices, note, gpus)


def check_network(cfg: RunConfig) -> None:
    """The network a multi-process run is given: ``dist.interface``, when set, is an interface
    of this machine with an address (gloo is told to bind it); and in a multi-node run the
    address this machine gives the other nodes is one they can reach (``hw.netaddr``),
    checked before the rendezvous would wait its whole timeout. Raises ConfigError."""
    import os

    from gputui.hw.netaddr import interface_problem, is_loopback, loopback_problem

    name = cfg.dist.interface
    absent = interface_problem(name) if name else None
    if absent:
        raise ConfigError(absent)
    host = cfg.dist.rdzv_endpoint.rpartition(":")[0].strip("[]")
    if cfg.dist.nnodes < 2 or host == "localhost" or is_loopback(host):
        return  # one node, or every node on this machine: loopback reaches them all
    problem = loopback_problem(name, os.environ)
    if problem:
        raise ConfigError(f"dist.nnodes = {cfg.dist.nnodes}: {problem}")


def check_disk(cfg: RunConfig, source: str = "config",
               origins: dict[str, str] | None = None,
               devices: list[Device] | None = None) -> None:
    """What the disk says of the config: the files it names (``gputui.plan.check_files``),
    its dataset (present, and large enough for the batch), then, for model_parallel or pp
    with a ``model.factory``, whether that model cuts into one stage per device (built in a
    check child, ``gputui.runs.model_check``); raises ConfigError. Reads the disk: once per
    run, never on a keystroke."""
    plan.check_files(cfg, source, origins)
    _check_data(cfg, source, origins)
    if cfg.data.name == "text" and not cfg.data.factory and devices:
        # the warm-up rule once the text's size is known (plan.validate cannot read it)
        total, _ = text_bytes(cfg.data.path)
        late = plan.warmup_problem(cfg, devices, text_windows(total, cfg.data.context,
                                                               cfg.data.train_size))
        if late:
            keys = ("optim.warmup_steps", "run.epochs", "optim.batch_size", "data.path")
            raise ConfigError(f"{plan.blame(source, origins, *keys, text=late)}: {late}")
    problem = cut_problem(cfg, devices)
    if problem:
        raise ConfigError(f"{plan.blame(source, origins, *CUT_KEYS, text=problem)}: {problem}")


def load_base(path: str | Path, overrides: Sequence[tuple[str, str, Any]] = ()) -> RunConfig:
    """The preset a sweep or a prediction varies, with its overrides: its values and its
    dataset checked. Its own strategy and devices are replaced point by point, so the
    cross-field rules wait for each point's :func:`prepare`."""
    cfg = load_preset(path, overrides)
    _check_data(cfg, str(path), override_origins(overrides))
    return cfg


def _check_data(cfg: RunConfig, source: str, origins: dict[str, str] | None = None) -> None:
    """The dataset is there and large enough; a refusal is blamed on the flags that set the
    keys it names (``--batch-size``, ``--set data.name=...``), else on ``source``."""
    problem = data_problem(cfg)
    if problem:
        where = plan.blame(source, origins, "data.name", "data.root", text=problem)
        raise ConfigError(f"{where}: data: {problem}")


def load_checked(path: str | Path, overrides: Sequence[tuple[str, str, Any]] = (),
                 what: str = "preset") -> Prepared:
    """A preset (``what`` it is: a "preset", or a resumed run's "run config") with its
    overrides (CLI last), prepared: every rule checked, the flags that broke one named."""
    cfg = load_preset(path, overrides, what)
    return prepare(cfg, str(path), override_origins(overrides))


def override_checked(cfg: RunConfig, overrides: Sequence[tuple[str, str, Any]] = (),
                     preset_source: str = "config") -> Prepared:
    """``cfg`` with ``overrides`` applied, prepared (``config.apply_overrides`` plus every
    rule)."""
    changed = apply_overrides(cfg, overrides)
    return prepare(changed, preset_source, override_origins(overrides))
