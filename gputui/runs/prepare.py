"""From a config to the devices it runs on, every rule checked: the path the CLI, the sweep and
the measuring runs take before a launch.

Discovery runs once (``gputui.hw.discovery``, only when the spec names GPUs), the config is
checked against the devices it gave (``gputui.plan.validate``), then the files it names
(``gputui.plan.check_files``). The devices, the fallback's note and the GPUs seen are handed on,
so the launch and its warnings ask the hardware no second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputui import plan
from gputui.core.config import RunConfig, apply_overrides, load_preset, override_origins
from gputui.core.devices import Device, DeviceSpecError, GpuInfo
from gputui.hw.discovery import resolve_with_gpus


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
    then check its files unless ``files`` is False; raises ConfigError."""
    try:
        devices, note, gpus = resolve_with_gpus(cfg.devices.spec, cfg.devices.fallback)
    except DeviceSpecError as exc:
        raise plan.device_error(exc, source, origins) from None
    plan.validate(cfg, devices, source, origins)
    if files:
        plan.check_files(cfg, source, origins)
    return Prepared(cfg, devices, note, gpus)


def load_checked(path: str | Path, overrides: Sequence[tuple[str, str, Any]] = ()) -> Prepared:
    """A preset with its overrides (CLI last), prepared: every rule checked, the flags that
    broke one named."""
    cfg = load_preset(path, overrides)
    return prepare(cfg, str(path), override_origins(overrides))


def override_checked(cfg: RunConfig, overrides: Sequence[tuple[str, str, Any]] = (),
                     preset_source: str = "config") -> Prepared:
    """``cfg`` with ``overrides`` applied, prepared (``config.apply_overrides`` plus every
    rule)."""
    changed = apply_overrides(cfg, overrides, preset_source)
    return prepare(changed, preset_source, override_origins(overrides))
