"""GPU discovery: which GPUs this machine has (through NVML, never torch, so the UI process can
ask without initialising CUDA), what a device choice resolves to here, and who else uses them.

The only module outside ``gputui.hw`` that reaches NVML. Parsing a choice against GPUs
already known is ``gputui.core.devices``; checking a config against resolved devices is
``gputui.plan``. Call discovery once per run (or once per refresh in the app) and hand the
result on.
"""

from __future__ import annotations

import os

from gputui.core.devices import Device, GpuInfo, resolve_spec, wants_gpus


def discover_gpus() -> tuple[list[GpuInfo], str]:
    """The GPUs the run can use (CUDA ordinals) and, when there are none, the reason why.

    The reason is a clause ("the NVIDIA driver is not loaded");
    :func:`gputui.core.devices.no_gpu_sentence` turns it into the sentence shown to users. Never
    raises and never initialises CUDA.
    """
    from gputui.hw import nvml

    return nvml.cuda_gpus()


def resolve_with_gpus(spec: str, fallback: str = "none", gpus: list[GpuInfo] | None = None,
                      reason: str = "") -> tuple[list[Device], str, list[GpuInfo]]:
    """The devices ``spec`` gives here, a one-line note when ``fallback`` replaced them (see
    :func:`gputui.core.devices.resolve_spec`), and the GPUs they were chosen from. GPUs are
    discovered (once) only when ``gpus`` is None and the spec names GPUs; [] otherwise.
    Raises DeviceSpecError when the spec cannot be met."""
    if gpus is None and wants_gpus(spec):
        gpus, reason = discover_gpus()
    gpus = list(gpus or [])
    return (*resolve_spec(spec, fallback, gpus, reason), gpus)


def resolve_with_note(spec: str, fallback: str = "none", gpus: list[GpuInfo] | None = None,
                      reason: str = "") -> tuple[list[Device], str]:
    """The devices ``spec`` gives here, and the fallback's note (:func:`resolve_with_gpus`)."""
    return resolve_with_gpus(spec, fallback, gpus, reason)[:2]


def resolve_devices(spec: str, fallback: str = "none",
                    gpus: list[GpuInfo] | None = None, reason: str = "") -> list[Device]:
    """Parse ``spec`` here; with fallback 'cpu', GPUs that are missing become CPU virtual
    devices."""
    return resolve_with_note(spec, fallback, gpus, reason)[0]


def busy_warnings(devices: list[Device], gpus: list[GpuInfo] | None = None,
                  own_pids: set[int] | frozenset = frozenset(),
                  cpu_cores: int | None = None) -> list[str]:
    """Warning lines for the chosen devices: GPUs other processes are using, and CPU virtual
    devices that outnumber the cores (they then take turns, which skews per-device timings).
    ``gpus`` as discovery gave them (discovered here when None); ``own_pids`` are the run's
    own processes, not counted as "other"."""
    lines: list[str] = []
    cuda = [d for d in devices if d.kind == "cuda"]
    if cuda:
        if gpus is None:
            gpus, _ = discover_gpus()
        by_index = {g.index: g for g in gpus}
        for dev in cuda:
            gpu = by_index.get(dev.index)
            others = [p for p in gpu.processes if p.pid not in own_pids] if gpu else []
            if gpu is not None and (others or (gpu.busy and not gpu.processes)):
                listed = ", ".join(p.describe() for p in others[:3])
                more = f" and {len(others) - 3} more" if len(others) > 3 else ""
                who = f"{len(others)} other process(es): {listed}{more}" if others else \
                    "another process"
                lines.append(f"{dev.name} ({gpu.name}) is busy, used by {who}; training "
                             f"will share its memory and compute")
    n_cpu = sum(1 for d in devices if d.kind == "cpu")
    cores = cpu_cores if cpu_cores is not None else (os.cpu_count() or 1)
    if n_cpu > cores:
        lines.append(f"{n_cpu} CPU virtual devices share {cores} CPU core(s), so they take "
                     f"turns; per-device speed will be lower than on separate devices")
    return lines


def gpu_links(gpus: list[GpuInfo]) -> dict[tuple[int, int], tuple[int, str | None]]:
    """How each pair of GPUs (by CUDA ordinal, lower first) is joined: active NVLinks between
    them and the PCIe path NVML names (None where it does not say). Blocking NVML calls:
    from a thread worker. {} without NVML."""
    from gputui.hw import nvml

    out: dict[tuple[int, int], tuple[int, str | None]] = {}
    whole = [g for g in gpus if not g.mig]
    for i, a in enumerate(whole):
        for b in whole[i + 1:]:
            ha, hb = nvml.handle(a.uuid), nvml.handle(b.uuid)
            if ha is not None and hb is not None:
                out[min(a.index, b.index), max(a.index, b.index)] = nvml.link(ha, hb, b.pci_bus_id)
    return out
