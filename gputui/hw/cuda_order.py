"""Which NVML device each CUDA ordinal is, computed without initialising CUDA.

CUDA numbers devices its own way: FASTEST_FIRST by default, PCI bus order when
CUDA_DEVICE_ORDER=PCI_BUS_ID, then renumbered by CUDA_VISIBLE_DEVICES. NVML numbers them in
PCI order (what nvidia-smi shows). This module maps one onto the other by UUID, from plain
records, so it is testable without a GPU and imports neither torch nor pynvml.

Ordering choice: gputui always uses PCI bus order. CUDA's FASTEST_FIRST heuristic is not
documented well enough to reproduce; on a box of identical GPUs it falls back to PCI order
anyway, and the launcher runs training with CUDA_DEVICE_ORDER=PCI_BUS_ID (see
:func:`cuda_env`) so that, on a mixed box too, the ordinal a user picks is the GPU training
gets. CUDA_VISIBLE_DEVICES is read the way the CUDA runtime reads it (the rules PyTorch's
NVML-based device count mirrors): integer ordinals, ``GPU-<uuid prefix>`` and ``MIG-<uuid>``
lists, parsing stopping at the first invalid entry, and a repeated entry hiding every device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NvmlGpu:
    """A physical GPU (or one MIG device of it) as NVML lists it."""

    nvml_index: int  # NVML's index of the physical GPU (for a MIG device: its parent's)
    uuid: str  # "GPU-..." or, for a MIG device, "MIG-..."
    name: str
    pci_bus_id: str = ""
    migs: tuple[NvmlGpu, ...] = ()  # the MIG devices, when MIG mode is enabled
    parent_uuid: str = ""  # set on a MIG device only
    mig_index: int | None = None  # the MIG device's slot on its parent
    gi: int | None = None  # GPU instance id (MIG)
    ci: int | None = None  # compute instance id (MIG)

    @property
    def is_mig(self) -> bool:
        """True for a MIG device (a slice of a physical GPU)."""
        return bool(self.parent_uuid)


@dataclass
class CudaOrder:
    """The devices CUDA will number 0, 1, ... and why some may be missing."""

    devices: list[NvmlGpu] = field(default_factory=list)
    reason: str = ""  # why no device is visible (empty when some are)
    notes: list[str] = field(default_factory=list)  # caveats worth showing the user


def pci_key(bus_id: str) -> tuple:
    """Sort key for "00000000:3B:00.0" (domain:bus:device.function, all hex)."""
    parts = re.split(r"[:.]", bus_id.strip())
    try:
        return (0,) + tuple(int(p, 16) for p in parts)
    except ValueError:
        return (1, bus_id)  # unreadable ids sort last, in a stable order


def _strtoul(token: str) -> int:
    # CUDA reads an ordinal like C's strtoul: leading digits count, "1gpu" is 1, "-1" or
    # "x" is invalid (-1 here), which stops the list.
    m = re.match(r"[+-]?\d+", token)
    return int(m.group(0)) if m else -1


def _flatten(base: list[NvmlGpu]) -> list[NvmlGpu]:
    # CUDA cannot use a MIG-enabled GPU as a whole; it sees that GPU's MIG devices instead.
    out: list[NvmlGpu] = []
    for gpu in base:
        out.extend(gpu.migs if gpu.migs else (gpu,))
    return out


def _by_uuid(token: str, candidates: list[NvmlGpu]) -> list[NvmlGpu]:
    t = token.lower()
    legacy = re.match(r"^mig-(gpu-[0-9a-f-]+)/(\d+)/(\d+)$", t)
    if legacy:  # CUDA 11.0's form: MIG-GPU-<parent uuid>/<gi>/<ci>
        parent, gi, ci = legacy.group(1), int(legacy.group(2)), int(legacy.group(3))
        return [c for c in candidates if c.parent_uuid.lower().startswith(parent)
                and c.gi == gi and c.ci == ci]
    return [c for c in candidates if c.uuid.lower().startswith(t)]


def cuda_order(gpus: list[NvmlGpu], visible: str | None,
               device_order: str | None = None) -> CudaOrder:
    """Map NVML's GPUs to CUDA ordinals given CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER."""
    base = sorted(gpus, key=lambda g: pci_key(g.pci_bus_id))
    out = CudaOrder()
    if (device_order or "").upper() != "PCI_BUS_ID" and len({g.name for g in base}) > 1:
        out.notes.append("CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs differ, so CUDA's "
                         "default fastest-first numbering may differ from the PCI order shown; "
                         "gputui starts training with CUDA_DEVICE_ORDER=PCI_BUS_ID")
    if any(g.migs for g in base):
        out.notes.append("MIG is enabled: each MIG device is listed as one CUDA device, and some "
                         "CUDA versions let a process use only the first of them")
    if visible is None:
        out.devices = _flatten(base)
        return out
    tokens = [t.strip() for t in visible.split(",")]
    chosen: list[NvmlGpu] = []
    seen: set[str] = set()
    prefix = tokens[0][:4].upper() if tokens[0][:4].upper() in ("GPU-", "MIG-") else ""
    for token in tokens:
        if prefix:
            if not token.upper().startswith(prefix):
                break
            pool = [g for g in base if not g.migs] if prefix == "GPU-" else \
                [m for g in base for m in g.migs]
            hits = _by_uuid(token, pool)
            if len(hits) > 1:
                # An ambiguous prefix makes CUDA reject the whole list.
                out.reason = (f"CUDA_VISIBLE_DEVICES='{visible}' hides every GPU: '{token}' "
                              f"matches several")
                return out
            if not hits:
                break
            picked = hits
        else:
            ordinal = _strtoul(token)
            if ordinal < 0 or ordinal >= len(base):
                break
            picked = list(base[ordinal].migs) or [base[ordinal]]
        key = ",".join(p.uuid for p in picked)
        if key in seen:
            # CUDA treats a repeated device as an invalid list and hides every device.
            out.reason = (f"CUDA_VISIBLE_DEVICES='{visible}' names a device twice, which makes "
                          f"CUDA hide every GPU")
            return out
        seen.add(key)
        chosen.extend(picked)
    out.devices = chosen
    if not chosen and base:
        out.reason = (f"CUDA_VISIBLE_DEVICES='{visible}' hides all {len(base)} GPU(s) of "
                      f"this machine")
    return out


def cuda_env() -> dict[str, str]:
    """Environment a training process needs so CUDA numbers GPUs the way gputui shows them."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
