"""What discovery knows of a GPU (NVML's view, indexed by CUDA ordinal) and how its bytes read.

A leaf: both device parsing (``gputui.core.devices``) and NVML (``gputui.hw.nvml``) use these,
so neither has to import the other for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML reports on a GPU."""

    pid: int
    used_mem: int | None = None  # bytes of GPU memory, None when NVML cannot tell
    name: str = ""  # process name, "" when it cannot be read (e.g. another container)

    def describe(self) -> str:
        """Short form for tables and warnings: "pid 4242 python 1.2 GiB"."""
        parts = [f"pid {self.pid}"] + ([self.name] if self.name else [])
        if self.used_mem is not None:
            parts.append(human_bytes(self.used_mem))
        return " ".join(parts)


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as discovery reports it, indexed by its CUDA ordinal; None = not available."""

    index: int  # the CUDA ordinal the run will use (CUDA_VISIBLE_DEVICES applied)
    name: str
    uuid: str = ""
    busy: bool = False  # another process runs on it
    nvml_index: int | None = None  # NVML's (nvidia-smi's) index of the physical GPU
    pci_bus_id: str = ""
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    util: float | None = None  # percent
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig: bool = False  # a MIG slice of a physical GPU

    def to_dict(self) -> dict:
        """Plain dict for `gputui devices --json`."""
        out = dataclasses.asdict(self)
        out["device"] = f"cuda:{self.index}"
        return out


def human_bytes(n: int | None) -> str:
    """1536 -> "1.5 KiB"; None -> "n/a"."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
