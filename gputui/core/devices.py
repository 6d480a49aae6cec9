"""Device choice: parse what users write ("0,2", "all", "2", "cuda:*", "cpu*4") into devices.

Pure parsing against a list of GPUs someone else discovered: nothing here asks the hardware
(``gputui.hw.discovery`` does, through NVML). Indices are CUDA ordinals as the run will see them
(CUDA_VISIBLE_DEVICES applied).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gputui.core.errors import UserError
from gputui.core.gpus import GpuInfo, GpuProcess, human_bytes  # noqa: F401 - also this module's API


class DeviceSpecError(UserError, ValueError):
    """A device choice that cannot be satisfied; the message is one line with the fix."""


def backend_for(requested: str, device_kind: str) -> str:
    """The process-group backend strategy.backend names: "auto" is nccl on CUDA devices and
    gloo on CPU ones; "gloo" and "nccl" are themselves."""
    if requested != "auto":
        return requested
    return "nccl" if device_kind == "cuda" else "gloo"


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


MAX_DEVICES = 64  # devices one machine's spec may name: cpu*N's N, and a sweep's counts
_CPU = re.compile(r"^cpu(?:\s*\*\s*(\d+))?$")
_PATTERN = re.compile(r"^(cuda|gpu):\*$", re.IGNORECASE)
_CUDA_ONE = re.compile(r"^(?:cuda|gpu):(\d+)$", re.IGNORECASE)

SPEC_HELP = ("'cpu', 'cpu*N', GPU indices '0,2', 'all', a count 'N', 'cuda:*' or 'cuda:1'")


def cpu_devices(n: int) -> list[Device]:
    """N CPU virtual devices."""
    return [Device("cpu", i, "CPU virtual device") for i in range(n)]


def parse_spec(spec: str, gpus: list[GpuInfo], no_gpu_reason: str = "") -> list[Device]:
    """Resolve ``spec`` against the machine's GPUs; raise DeviceSpecError when impossible.

    Forms: "cpu" / "cpu*N" (CPU virtual devices), "all", "cuda:*" / "gpu:*" (every GPU), a
    count "N" (the first N GPUs; a lone "0" means GPU 0), indices "0,2" or "cuda:0,cuda:2",
    and "1," for the single GPU 1. ``gpus`` are indexed by CUDA ordinal.
    """
    text = spec.strip()
    if not text:
        raise DeviceSpecError(f"the device choice is empty; use {SPEC_HELP}")
    m = _CPU.match(text.lower())
    if m:
        n = int(m.group(1) or 1)
        if not 1 <= n <= MAX_DEVICES:
            raise DeviceSpecError(f"'{spec}': the number of CPU virtual devices must be 1 to "
                                  f"{MAX_DEVICES}")
        return cpu_devices(n)
    why = f" ({no_gpu_reason})" if no_gpu_reason else ""
    lowered = text.lower()
    if lowered == "all" or _PATTERN.match(text):
        if not gpus:
            raise DeviceSpecError(f"'{spec}' selects GPUs but none is available{why}; "
                                  f"use cpu or cpu*N")
        return [_gpu(g) for g in gpus]
    parts = [p.strip() for p in text.split(",")]
    # A lone number is a count ("2": the first two); "0" cannot be a count, so it is GPU 0.
    if len(parts) == 1 and parts[0].isdecimal() and int(parts[0]) > 0:
        count = int(parts[0])
        if count > len(gpus):
            if gpus:
                raise DeviceSpecError(f"'{spec}' asks for {count} GPUs but this machine has "
                                      f"only {len(gpus)}; use a count up to {len(gpus)}, "
                                      f"or 'all'")
            raise DeviceSpecError(f"'{spec}' asks for {count} GPUs but this machine has "
                                  f"none{why}; use cpu*{count}")
        return [_gpu(g) for g in gpus[:count]]
    indices: list[int] = []
    for part in parts:
        one = _CUDA_ONE.match(part)
        if one:
            indices.append(int(one.group(1)))
        elif part.isdecimal():
            indices.append(int(part))
        elif part == "" and len(parts) == 2:
            continue  # "1," means GPU 1 (a lone "1" is a count)
        elif _CPU.match(part.lower()) and all(_CPU.match(q.lower()) for q in parts):
            n = sum(int(m.group(1) or 1) for q in parts if (m := _CPU.match(q.lower())))
            raise DeviceSpecError(f"'{spec}' lists CPU devices with commas, which are for GPU "
                                  f"indices; write cpu*{n} for {n} CPU virtual devices")
        elif _CPU.match(part.lower()):
            raise DeviceSpecError(f"'{spec}' mixes CPU virtual devices and GPUs; "
                                  f"choose either cpu*N or GPU indices")
        else:
            raise DeviceSpecError(f"'{spec}': cannot read '{part}'; use {SPEC_HELP}")
    if not indices:
        raise DeviceSpecError(f"'{spec}' names no device; use {SPEC_HELP}")
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
    if text.isdecimal():
        return max(1, int(text))  # "0" is GPU 0
    if text == "all" or _PATTERN.match(text):
        return 1
    return len([p for p in text.split(",") if p.strip()])


def no_gpu_sentence(reason: str) -> str:
    """The one plain sentence explaining why no GPU is listed."""
    why = reason or "no NVIDIA GPU was found"
    return f"No GPU is listed because {why}; CPU virtual devices (cpu, cpu*N) are used instead."


def resolve_spec(spec: str, fallback: str, gpus: list[GpuInfo],
                 reason: str = "") -> tuple[list[Device], str]:
    """The devices ``spec`` gives among ``gpus``, and a one-line note when ``fallback``
    replaced them (``reason``: why there is no GPU, as discovery said).

    With fallback 'cpu', a spec naming GPUs that are not all there (none at all, fewer than
    asked, an index that does not exist) runs on as many CPU virtual devices as it asked
    for, and the note says so. A spec that is wrong on any machine ("0,0", "cpu,1") is
    refused whatever the fallback."""
    try:
        return parse_spec(spec, gpus, reason), ""
    except DeviceSpecError:
        if fallback != "cpu" or not wants_gpus(spec) or not _valid_anywhere(spec):
            raise
    n = max(1, requested_count(spec))
    have = f"this machine has {len(gpus)} GPU(s)" if gpus else \
        f"no GPU is available ({reason or 'no NVIDIA GPU was found'})"
    return cpu_devices(n), (f"devices.spec '{spec.strip()}' cannot be met ({have}); running on "
                            f"{n} CPU virtual device(s) instead, as devices.fallback = 'cpu' says")


def _valid_anywhere(spec: str) -> bool:
    """True when ``spec`` is well formed, i.e. some machine (one with MAX_DEVICES GPUs) could
    meet it."""
    try:
        parse_spec(spec, [GpuInfo(i, "") for i in range(MAX_DEVICES)])
    except DeviceSpecError:
        return False
    return True
