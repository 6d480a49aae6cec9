"""What the set-up screen's device table lists: GPUs (through NVML) and CPU virtual devices.

Discovery goes through ``gputui.hw.discovery.discover_gpus`` (NVML only, never torch) and psutil,
and is called from a thread worker. Tests and screenshots pass a fixed :class:`Inventory`
instead, so nothing here varies between runs there. No Textual in this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gputui.core.devices import Device, GpuInfo
from gputui.tui.fmt import fmt_bytes

MAX_CPU_DEVICES = 8
_PRIMED: list[bool] = []  # psutil's CPU % has a baseline (one flag, set by the first reading)


@dataclass(frozen=True)
class DeviceRow:
    """One row of the device table."""

    kind: str  # "cuda" | "cpu"
    index: int
    label: str
    memory: str = "n/a"
    util: str = "n/a"
    status: str = "free"
    busy: bool = False

    @property
    def name(self) -> str:
        """'cuda:1' or 'cpu:0'."""
        return f"{self.kind}:{self.index}"

    def device(self) -> Device:
        """The row as a training Device."""
        return Device(self.kind, self.index, self.label)


@dataclass(frozen=True)
class Inventory:
    """The machine's GPUs, the host as CPU virtual devices see it, and why no GPU is listed."""

    gpus: tuple[DeviceRow, ...] = ()
    no_gpu_reason: str = ""
    host_memory: str = "n/a"
    host_util: str = "n/a"
    cores: int = 1
    gpu_infos: tuple[GpuInfo, ...] = field(default=(), compare=False)
    # False until discovery has answered: the app's first paint comes before it, and a preset's
    # GPUs must wait for it rather than fall back to CPU devices
    discovered: bool = True
    # (cuda i, cuda j) -> (active NVLinks between them, the PCIe path), from discovery
    links: dict = field(default_factory=dict, compare=False)

    def cpu_rows(self, n: int) -> list[DeviceRow]:
        """N CPU virtual devices; they share the host's cores and memory."""
        share = f"shares {self.cores} core{'s' if self.cores != 1 else ''}"
        status = "free" if n <= self.cores else f"free · {share} (oversubscribed)"
        return [DeviceRow("cpu", i, "CPU virtual device", self.host_memory, self.host_util,
                          status) for i in range(n)]

    def gpu_note(self) -> str:
        """The one sentence shown when the table lists no GPU."""
        if not self.discovered:
            return "Looking for GPUs (NVML)…"
        if self.gpus:
            return ""
        why = self.no_gpu_reason or "no GPU was found"
        return f"No GPU is listed because {why}; training runs on CPU virtual devices."


def gpu_indices(inventory: Inventory) -> tuple[int, ...]:
    """The CUDA ordinals the inventory lists (what a change of GPUs is judged by)."""
    return tuple(r.index for r in inventory.gpus)


def device_row(g: GpuInfo) -> DeviceRow:
    """A table row from a discovered GPU (fields the discovery lacks show as n/a)."""
    used, total = getattr(g, "mem_used", None), getattr(g, "mem_total", None)
    memory = f"{fmt_bytes(used)} / {fmt_bytes(total)}" if total else "n/a"
    util = getattr(g, "util", None)
    procs = getattr(g, "processes", ()) or ()
    if g.busy:
        who = procs[0].describe() if procs and hasattr(procs[0], "describe") else "another process"
        status = f"busy ({who})"
    else:
        status = "free"
    return DeviceRow("cuda", g.index, g.name, memory,
                     f"{util:.0f}%" if util is not None else "n/a", status, g.busy)


def discover_inventory() -> Inventory:
    """Ask NVML and psutil now (blocking: call from a thread worker)."""
    from gputui.hw.discovery import discover_gpus

    try:
        gpus, reason = discover_gpus()
    except Exception as exc:  # discovery must never take the app down
        gpus, reason = [], f"GPU discovery failed ({type(exc).__name__}: {exc})"
    memory, util = "n/a", "n/a"
    try:
        import psutil

        vm = psutil.virtual_memory()
        memory = f"{fmt_bytes(vm.used)} / {fmt_bytes(vm.total)} host"
        # The first non-blocking reading is meaningless (0.0): measure 0.2 s once instead.
        first = not _PRIMED
        _PRIMED.append(True)
        util = f"{psutil.cpu_percent(interval=0.2 if first else None):.0f}% host"
    except Exception:  # psutil missing or unreadable: the table says n/a
        pass
    try:
        from gputui.hw.discovery import gpu_links

        links = gpu_links(gpus) if len(gpus) > 1 else {}
    except Exception:  # the links are a hint; the table stands without them
        links = {}
    return Inventory(tuple(device_row(g) for g in gpus), reason, memory, util,
                     os.cpu_count() or 1, tuple(gpus), links=links)


def links_note(selected: set[int], links: dict) -> str:
    """The links between the chosen GPUs, one pair a line, a warning on a pair without a
    fast link (a pair without NVLink ran at 20 GB/s where an NVLink pair ran at 208 in
    nccl-tests#178); "" for fewer than two GPUs or when NVML did not say."""
    chosen = sorted(selected)
    lines = []
    for n, i in enumerate(chosen):
        for j in chosen[n + 1:]:
            if (i, j) not in links:
                continue
            nvlinks, path = links[i, j]
            pair = f"cuda:{i}–cuda:{j}"
            if nvlinks:
                lines.append(f"{pair}: NVLink ×{nvlinks}")
            else:
                lines.append(f"⚠ {pair}: no NVLink, {path or 'PCIe'}: collectives between "
                             f"them run at PCIe speed, far below NVLink's")
    return "\n".join(lines)
