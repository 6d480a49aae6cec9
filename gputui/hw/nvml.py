"""The one NVML entry point (the only module that imports pynvml).

Initialises lazily on first use, shuts down at exit (or on :func:`shutdown`), never raises for
a missing value (a reading NVML cannot give is None, "not available"), and explains in one
clause why no GPU is listed when there is no driver, library or device. Nothing here touches
CUDA, so the UI process can call it freely. Tests hand a fake module to :func:`use_module`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gputui.core.gpus import GpuInfo, GpuProcess
from gputui.hw.cuda_order import CudaOrder, NvmlGpu, cuda_order

_lock = threading.RLock()
_state: dict[str, Any] = {"mod": None, "ready": None, "reason": "", "closed": False,
                          "atexit": False, "handles": {}}
_override: list[Any] = []  # a module injected by use_module(); empty = import pynvml

# Why nvmlInit failed, by pynvml's error class name, as the end of "No GPU is listed because".
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver is installed: libnvidia-ml.so.1 was not "
                                "found",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "this user is not allowed to query the NVIDIA driver",
    "NVMLError_LibRmVersionMismatch": "the NVIDIA driver and its NVML library are different "
                                      "versions, as after a driver update without a reboot",
}


@dataclass(frozen=True)
class GpuReading:
    """One reading of a GPU's live figures; None means NVML could not give that value."""

    util: float | None = None  # percent
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


def use_module(mod: Any | None) -> None:
    """Use ``mod`` in place of pynvml (a fake for tests); None goes back to the real one."""
    shutdown()
    with _lock:
        _override[:] = [mod] if mod is not None else []
        _state.update(mod=None, ready=None, reason="", closed=False)


def init() -> bool:
    """Start NVML if it is not started; False (and :func:`reason` says why) when it cannot."""
    with _lock:
        if _state["ready"] is not None:
            return _state["ready"]
        if _state["closed"]:
            return False
        if _override:
            mod = _override[0]
        else:
            try:
                import pynvml
            except ImportError:
                _state.update(ready=False, reason="the nvidia-ml-py package that provides "
                                                  "pynvml is not installed")
                return False
            mod = pynvml
        try:
            mod.nvmlInit()
        except mod.NVMLError as exc:
            _state.update(ready=False, reason=_init_reason(mod, exc))
            return False
        except OSError as exc:
            _state.update(ready=False, reason=f"the NVIDIA driver library failed to load: {exc}")
            return False
        _state.update(mod=mod, ready=True, reason="", handles={})
        if not _state["atexit"]:
            atexit.register(_at_exit)
            _state["atexit"] = True
        return True


def _init_reason(mod: Any, exc: Exception) -> str:
    for name, text in _INIT_REASONS.items():
        cls = getattr(mod, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return text
    return f"NVML could not start: {exc}"


def reason() -> str:
    """Why NVML is unavailable ("" when it works or has not been tried)."""
    return _state["reason"]


def shutdown() -> None:
    """Stop NVML if it was started; a later call starts it again."""
    with _lock:
        if _state["ready"]:
            # At shutdown there is nobody left to tell about a failure.
            with contextlib.suppress(Exception):
                _state["mod"].nvmlShutdown()
        _state.update(mod=None, ready=None, handles={})


def _at_exit() -> None:
    # A daemon sampler thread may still poll while the interpreter exits: don't restart.
    with _lock:
        shutdown()
        _state["closed"] = True


def call(fn: str, *args: Any) -> Any:
    """``pynvml.<fn>(*args)``, or None when NVML is down, lacks ``fn`` or reports an error."""
    if not init():
        return None
    mod = _state["mod"]
    func = getattr(mod, fn, None) if mod is not None else None
    if func is None:
        return None
    try:
        return func(*args)
    except (mod.NVMLError, UnicodeDecodeError, OSError):
        return None


def text(value: Any) -> str | None:
    """NVML strings: str in nvidia-ml-py 12+, bytes in older bindings."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def driver_version() -> str | None:
    """The NVIDIA driver version, e.g. "575.57.08"."""
    return text(call("nvmlSystemGetDriverVersion"))


def nvml_gpus() -> list[NvmlGpu]:
    """Every physical GPU in NVML's order, with its MIG devices when MIG is on."""
    count = call("nvmlDeviceGetCount") or 0
    out: list[NvmlGpu] = []
    _state["skipped"] = []
    for i in range(count):
        h = call("nvmlDeviceGetHandleByIndex", i)
        uuid = text(call("nvmlDeviceGetUUID", h)) if h is not None else None
        if uuid is None:
            # Without its UUID a GPU cannot be matched to a CUDA ordinal (a lost GPU, or
            # one NVML may not query); listing it under a guessed number would mislead.
            _state["skipped"].append(i)
            continue
        pci = call("nvmlDeviceGetPciInfo", h)
        bus = text(getattr(pci, "busId", None)) or ""
        name = text(call("nvmlDeviceGetName", h)) or f"GPU {i}"
        _state["handles"][uuid] = h
        out.append(NvmlGpu(i, uuid, name, bus, migs=tuple(_migs(h, i, uuid, bus))))
    return out


def _migs(h: Any, index: int, parent: str, bus: str) -> list[NvmlGpu]:
    mode = call("nvmlDeviceGetMigMode", h)
    enabled = getattr(_state["mod"], "NVML_DEVICE_MIG_ENABLE", 1)
    if not mode or mode[0] != enabled:
        return []
    out = []
    for j in range(call("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
        mh = call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
        if mh is None:
            continue  # an empty slot
        uuid = text(call("nvmlDeviceGetUUID", mh)) or f"{parent}/mig{j}"
        _state["handles"][uuid] = mh
        out.append(NvmlGpu(index, uuid, text(call("nvmlDeviceGetName", mh)) or f"MIG {j}",
                           bus, parent_uuid=parent, mig_index=j,
                           gi=call("nvmlDeviceGetGpuInstanceId", mh),
                           ci=call("nvmlDeviceGetComputeInstanceId", mh)))
    return out


def handle(uuid: str) -> Any | None:
    """NVML's handle for a GPU or MIG device UUID (cached), None when it is gone."""
    h = _state["handles"].get(uuid)
    if h is None and init():
        h = call("nvmlDeviceGetHandleByUUID", uuid)
        if h is not None:
            _state["handles"][uuid] = h
    return h


def read(h: Any) -> GpuReading:
    """Utilization, memory, temperature and power of one device; missing values are None."""
    mem = call("nvmlDeviceGetMemoryInfo", h)
    util = call("nvmlDeviceGetUtilizationRates", h)
    sensor = getattr(_state["mod"], "NVML_TEMPERATURE_GPU", 0)
    temp = call("nvmlDeviceGetTemperature", h, sensor)
    power = call("nvmlDeviceGetPowerUsage", h)  # milliwatts
    limit = call("nvmlDeviceGetEnforcedPowerLimit", h)
    return GpuReading(
        util=_num(getattr(util, "gpu", None)),
        mem_used=getattr(mem, "used", None), mem_total=getattr(mem, "total", None),
        temp_c=_num(temp),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0)


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def processes(h: Any) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes on a device, each once, with their names."""
    found: dict[int, GpuProcess] = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in call(fn, h) or ():
            pid = int(getattr(p, "pid", 0) or 0)
            if pid and pid not in found:
                found[pid] = GpuProcess(pid, getattr(p, "usedGpuMemory", None), _proc_name(pid))
    return tuple(found.values())


def _proc_name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""  # gone, or another container's pid namespace


def order(env: Mapping[str, str] | None = None) -> CudaOrder:
    """NVML's GPUs in CUDA's numbering for the given environment (default: this process's)."""
    env = os.environ if env is None else env
    out = cuda_order(nvml_gpus(), env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"))
    for i in _state.get("skipped", ()):
        out.notes.append(f"NVML device {i} did not report its UUID (lost or not queryable), "
                         f"so it is left out")
    return out


def cuda_gpus(env: dict[str, str] | None = None) -> tuple[list[GpuInfo], str]:
    """GPUs by CUDA ordinal with their live figures, and the reason when there are none."""
    if not init():
        return [], reason()
    if call("nvmlDeviceGetCount") is None:
        return [], "the NVIDIA driver did not say how many GPUs there are"
    seen = order(env)
    out = []
    for i, g in enumerate(seen.devices):
        h = handle(g.uuid)
        r = read(h) if h is not None else GpuReading()
        procs = processes(h) if h is not None else ()
        out.append(GpuInfo(i, g.name, g.uuid, bool(procs), g.nvml_index, g.pci_bus_id,
                           r.mem_used, r.mem_total, r.util, r.temp_c, r.power_w,
                           r.power_limit_w, procs, g.is_mig))
    if out:
        return out, ""
    return [], seen.reason or "the NVIDIA driver is loaded but reports no GPU"


# ---------------------------------------------------------------- energy, GPM, links
def energy_mj(h: Any) -> int | None:
    """The device's energy counter since the driver loaded, in millijoules (Volta and newer;
    None where the GPU or driver lacks it)."""
    value = call("nvmlDeviceGetTotalEnergyConsumption", h)
    return None if value is None else int(value)


# what gputui reads from GPM (Hopper and newer), by its own name: SM active (the share of SMs
# busy), SM occupancy (warps resident against the maximum) and tensor active (any tensor op)
GPM_METRICS = {"sm_active": "NVML_GPM_METRIC_SM_UTIL",
               "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
               "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL"}


def gpm_supported(h: Any) -> bool:
    """Whether the device gives GPM metrics (``nvmlGpmQueryDeviceSupport``)."""
    support = call("nvmlGpmQueryDeviceSupport", h)
    return bool(getattr(support, "isSupportedDevice", 0))


def gpm_sample(h: Any) -> Any | None:
    """A new GPM sample of the device, taken now (free it with :func:`gpm_free`), or None."""
    sample = call("nvmlGpmSampleAlloc")
    if sample is None:
        return None
    if call("nvmlGpmSampleGet", h, sample) is None:
        gpm_free(sample)
        return None
    return sample


def gpm_free(sample: Any) -> None:
    call("nvmlGpmSampleFree", sample)


def gpm_metrics(earlier: Any, later: Any) -> dict[str, float]:
    """The GPM metrics between two samples of one device, in percent (those NVML gave)."""
    mod = _state["mod"]
    make = getattr(mod, "c_nvmlGpmMetricsGet_t", None) if mod is not None else None
    wanted = [(name, getattr(mod, const, None)) for name, const in GPM_METRICS.items()]
    wanted = [(name, mid) for name, mid in wanted if mid is not None]
    if make is None or not wanted:
        return {}
    request = make()
    request.version = getattr(mod, "NVML_GPM_METRICS_GET_VERSION", 1)
    request.numMetrics = len(wanted)
    request.sample1, request.sample2 = earlier, later
    for i, (_, mid) in enumerate(wanted):
        request.metrics[i].metricId = mid
    got = call("nvmlGpmMetricsGet", request)
    if got is None:
        return {}
    ok = getattr(mod, "NVML_SUCCESS", 0)
    return {name: float(got.metrics[i].value) for i, (name, _) in enumerate(wanted)
            if got.metrics[i].nvmlReturn == ok}


# nvmlDeviceGetTopologyCommonAncestor's levels, as nvidia-smi topo -m names them
TOPOLOGY = {0: "same board", 10: "PCIe switch", 20: "PCIe switches", 30: "PCIe host bridge",
            40: "across PCIe host bridges (one CPU)", 50: "across CPU sockets"}


def nvlinks(h: Any, other_bus: str) -> int:
    """Active NVLinks from ``h`` to the GPU at PCI bus id ``other_bus``."""
    count = 0
    for link in range(int(getattr(_state["mod"], "NVML_NVLINK_MAX_LINKS", 18))):
        state = call("nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            if link == 0:
                return 0  # no NVLink on this GPU (or driver): nothing to walk
            continue
        if not state:
            continue
        remote = call("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        bus = text(getattr(remote, "busId", None)) or ""
        if bus and bus.lower().endswith(other_bus.lower()[-12:]):
            count += 1
    return count


def link(a: Any, b: Any, b_bus: str) -> tuple[int, str | None]:
    """How two GPUs are joined: (active NVLinks between them, the PCIe path's description or
    None where NVML does not say)."""
    level = call("nvmlDeviceGetTopologyCommonAncestor", a, b)
    return nvlinks(a, b_bus), None if level is None else TOPOLOGY.get(int(level),
                                                                         f"level {level}")
