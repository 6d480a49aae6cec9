"""Device choice: parse what users write ("0,2", "all", "2", "cuda:*", "cpu*4") into devices.

GPU discovery goes through NVML (``gputui.telemetry.nvml``), never through torch, so the UI
process can resolve a spec without initialising CUDA. Indices are CUDA ordinals as the run
will see them (CUDA_VISIBLE_DEVICES applied), mapped from NVML by UUID/PCI bus id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class DeviceSpecError(ValueError):
    """A device choice that cannot be satisfied; the message is one line with the fix."""


@dataclass(frozen=True)
class Device:
    """One training device: a CUDA GPU or a CPU virtual device."""

    kind: str  # "cuda" | "cpu"
    index: int  # CUDA ordinal, or the virtual device's number
    label: str = ""  # e.g. "NVIDIA A100-SXM4-40GB" or "CPU virtual device"

    @property
    def name(self) -> str:
        """Display name, unique within a run: "cuda:1", "cpu:0"."""
        return f"{self.kind}:{self.index}"

    @property
    def torch_device(self) -> str:
        """The torch device string (every CPU virtual device lives on "cpu")."""
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def to_dict(self) -> dict:
        """Plain dict for events and the run record."""
        return {"name": self.name, "kind": self.kind, "index": self.index, "label": self.label}


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as discovery reports it, indexed by its CUDA ordinal."""

    index: int
    name: str
    uuid: str = ""
    busy: bool = False  # another process holds memory on it


_CPU = re.compile(r"^cpu(?:\s*\*\s*(\d+))?$")
_PATTERN = re.compile(r"^(cuda|gpu):\*$", re.IGNORECASE)
_CUDA_ONE = re.compile(r"^(?:cuda|gpu):(\d+)$", re.IGNORECASE)

SPEC_HELP = ("'cpu', 'cpu*N', GPU indices '0,2', 'all', a count 'N', 'cuda:*' or 'cuda:1'")


def cpu_devices(n: int) -> list[Device]:
    """N CPU virtual devices."""
    return [Device("cpu", i, "CPU virtual device") for i in range(n)]


def parse_spec(spec: str, gpus: list[GpuInfo], no_gpu_reason: str = "") -> list[Device]:
    """Resolve ``spec`` against the machine's GPUs; raise DeviceSpecError when impossible."""
    text = spec.strip()
    if not text:
        raise DeviceSpecError(f"the device choice is empty; use {SPEC_HELP}")
    m = _CPU.match(text.lower())
    if m:
        n = int(m.group(1) or 1)
        if not 1 <= n <= 64:
            raise DeviceSpecError(f"'{spec}': the number of CPU virtual devices must be 1 to 64")
        return cpu_devices(n)
    why = f" ({no_gpu_reason})" if no_gpu_reason else ""
    lowered = text.lower()
    if lowered == "all" or _PATTERN.match(text):
        if not gpus:
            raise DeviceSpecError(f"'{spec}' selects GPUs but none is available{why}; "
                                  f"use cpu or cpu*N")
        return [_gpu(g) for g in gpus]
    parts = [p.strip() for p in text.split(",")]
    if len(parts) == 1 and parts[0].isdigit():
        count = int(parts[0])
        if count < 1:
            raise DeviceSpecError(f"'{spec}': a device count must be at least 1")
        if count > len(gpus):
            have = f"only {len(gpus)}" if gpus else "none"
            raise DeviceSpecError(f"'{spec}' asks for {count} GPUs but this machine has "
                                  f"{have}{why}; use a smaller count or cpu*{count}")
        return [_gpu(g) for g in gpus[:count]]
    indices: list[int] = []
    for part in parts:
        one = _CUDA_ONE.match(part)
        if one:
            indices.append(int(one.group(1)))
        elif part.isdigit():
            indices.append(int(part))
        elif part == "" and len(parts) == 2:
            continue  # "1," means GPU 1 (a lone "1" is a count)
        else:
            raise DeviceSpecError(f"'{spec}': cannot read '{part}'; use {SPEC_HELP}")
    if len(set(indices)) != len(indices):
        raise DeviceSpecError(f"'{spec}' names a GPU twice; list each index once")
    by_index = {g.index: g for g in gpus}
    for i in indices:
        if i not in by_index:
            if not gpus:
                raise DeviceSpecError(f"'{spec}': GPU {i} does not exist, no GPU is "
                                      f"available{why}; use cpu or cpu*N")
            raise DeviceSpecError(f"'{spec}': GPU {i} does not exist; this machine has "
                                  f"{len(gpus)} GPU(s), indices 0-{len(gpus) - 1}")
    return [_gpu(by_index[i]) for i in indices]


def _gpu(g: GpuInfo) -> Device:
    return Device("cuda", g.index, g.name)


def wants_gpus(spec: str) -> bool:
    """True when the spec names GPUs (anything but cpu / cpu*N)."""
    return _CPU.match(spec.strip().lower()) is None


def requested_count(spec: str) -> int:
    """How many devices the spec asks for, when that is knowable without discovery."""
    text = spec.strip().lower()
    m = _CPU.match(text)
    if m:
        return int(m.group(1) or 1)
    if text.isdigit():
        return int(text)
    if text == "all" or _PATTERN.match(text):
        return 1
    return len([p for p in text.split(",") if p.strip()])


def discover_gpus() -> tuple[list[GpuInfo], str]:
    """The GPUs the run can use (CUDA ordinals) and, when there are none, the reason why."""
    from gputui.telemetry import nvml

    return nvml.cuda_gpus()


def resolve_devices(spec: str, fallback: str = "none",
                    gpus: list[GpuInfo] | None = None, reason: str = "") -> list[Device]:
    """Parse ``spec``; with fallback 'cpu', GPUs that are missing become CPU virtual devices."""
    if gpus is None and wants_gpus(spec):
        gpus, reason = discover_gpus()
    gpus = gpus or []
    try:
        return parse_spec(spec, gpus, reason)
    except DeviceSpecError:
        if fallback == "cpu" and wants_gpus(spec) and not gpus:
            return cpu_devices(max(1, requested_count(spec)))
        raise
