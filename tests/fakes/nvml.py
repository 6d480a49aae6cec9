"""An in-memory stand-in for the parts of ``pynvml`` that ``gputui.hw.nvml`` calls.

Real NVML needs an NVIDIA driver, which CI and most development machines lack. Tests (and
UI tests that want GPUs on screen) hand a :class:`FakeNvml` to ``nvml.use_module``. It mirrors
pynvml's shapes: the ``NVMLError`` hierarchy with a ``value`` code, handles, structs with
``total``/``used``, ``busId`` bytes, milliwatts, and errors raised before ``nvmlInit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

_CODES = {"Uninitialized": 1, "InvalidArgument": 2, "NotSupported": 3, "NoPermission": 4,
          "NotFound": 6, "DriverNotLoaded": 9, "LibraryNotFound": 12, "FunctionNotFound": 13,
          "GpuIsLost": 15, "LibRmVersionMismatch": 18, "Unknown": 999}


class NVMLError(Exception):
    """Base of the fake NVML errors; ``value`` is the NVML return code, as in pynvml."""

    value = 999

    def __init__(self, value: int | None = None):
        super().__init__()
        if value is not None:
            self.value = value

    def __str__(self) -> str:
        names = {v: k for k, v in _CODES.items()}
        return names.get(self.value, f"NVML error {self.value}")


# pynvml generates one subclass per code (NVMLError_NotSupported, ...); so does the fake.
_ERRORS = {name: type(f"NVMLError_{name}", (NVMLError,), {"value": code})
           for name, code in _CODES.items()}


@dataclass
class FakeGpu:
    """One fake GPU (or MIG device); None for a reading makes its call raise NotSupported."""

    name: str = "NVIDIA Fake GPU"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:01:00.0"
    mem_total: int | None = 16 * 1024**3
    mem_used: int | None = 0
    util: int | None = 0
    temp: int | None = 40
    power_mw: int | None = 50_000
    limit_mw: int | None = 250_000
    processes: list = field(default_factory=list)  # (pid, used bytes or None)
    migs: list = field(default_factory=list)  # FakeGpu MIG devices; non-empty = MIG on
    gi: int = 0
    ci: int = 0
    unsupported: set = field(default_factory=set)  # function names raising NotSupported
    lost: bool = False  # every call raises GpuIsLost
    energy_mj: int | None = 1_000_000  # the energy counter (None: NotSupported, pre-Volta)
    gpm: dict | None = None  # GPM metric id -> value (None: no GPM, pre-Hopper)
    nvlinks: list = field(default_factory=list)  # per link: the remote bus id, "" = inactive
    topology: dict = field(default_factory=dict)  # other GPU's bus id -> common-ancestor level


class _Metric:
    def __init__(self):
        self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0


class GpmMetricsGet:
    """pynvml's c_nvmlGpmMetricsGet_t: the caller fills version, numMetrics, the two samples
    and each metric's id; nvmlGpmMetricsGet fills each metric's nvmlReturn and value."""

    def __init__(self):
        self.version, self.numMetrics, self.sample1, self.sample2 = 0, 0, None, None
        self.metrics = [_Metric() for _ in range(98)]


class FakeNvml:
    """A module-like object exposing the pynvml functions gputui uses, over FakeGpu records."""

    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_SUCCESS = 0
    NVML_NVLINK_MAX_LINKS = 18
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    c_nvmlGpmMetricsGet_t = GpmMetricsGet
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: type | None = None,
                 as_bytes: bool = False, driver: str = "575.57.08"):
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.as_bytes = as_bytes  # old bindings returned bytes for strings
        self.driver = driver
        self.initialised = 0  # nvmlInit minus nvmlShutdown calls, as NVML counts them
        self.init_calls = 0
        self.calls: list[str] = []

    # --- library life cycle -------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._ready("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        self._ready("nvmlSystemGetDriverVersion")
        return self._s(self.driver)

    # --- enumeration --------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._ready("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._ready("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _ERRORS["InvalidArgument"]()
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid) -> FakeGpu:
        self._ready("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            for g in [gpu, *gpu.migs]:
                if g.uuid == uuid:
                    return g
        raise _ERRORS["NotFound"]()

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        self._check("nvmlDeviceGetMigMode", h)
        on = int(bool(h.migs))
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7 if h.migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= len(h.migs):
            raise _ERRORS["NotFound"]()  # an empty MIG slot, as real NVML reports it
        return h.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeGpu) -> int:
        return self._value("nvmlDeviceGetGpuInstanceId", h, h.gi)

    def nvmlDeviceGetComputeInstanceId(self, h: FakeGpu) -> int:
        return self._value("nvmlDeviceGetComputeInstanceId", h, h.ci)

    # --- identity and readings ----------------------------------------------------------
    def nvmlDeviceGetName(self, h: FakeGpu):
        return self._s(self._value("nvmlDeviceGetName", h, h.name))

    def nvmlDeviceGetUUID(self, h: FakeGpu):
        return self._s(self._value("nvmlDeviceGetUUID", h, h.uuid))

    def nvmlDeviceGetPciInfo(self, h: FakeGpu):
        bus = self._value("nvmlDeviceGetPciInfo", h, h.bus_id)
        return SimpleNamespace(busId=bus.encode(), busIdLegacy=bus[4:].encode())

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu):
        total = self._value("nvmlDeviceGetMemoryInfo", h, h.mem_total)
        used = self._value("nvmlDeviceGetMemoryInfo", h, h.mem_used)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu):
        return SimpleNamespace(gpu=self._value("nvmlDeviceGetUtilizationRates", h, h.util),
                               memory=0)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise _ERRORS["InvalidArgument"]()
        return self._value("nvmlDeviceGetTemperature", h, h.temp)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._value("nvmlDeviceGetPowerUsage", h, h.power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return self._value("nvmlDeviceGetEnforcedPowerLimit", h, h.limit_mw)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list:
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in h.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list:
        self._check("nvmlDeviceGetGraphicsRunningProcesses", h)
        return []

    # --- energy, GPM, links ----------------------------------------------------------------
    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._value("nvmlDeviceGetTotalEnergyConsumption", h, h.energy_mj)

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu):
        self._check("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(h.gpm is not None))

    def nvmlGpmSampleAlloc(self):
        self._ready("nvmlGpmSampleAlloc")
        self.gpm_live = getattr(self, "gpm_live", 0) + 1  # samples not freed yet
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleGet(self, h: FakeGpu, sample):
        self._check("nvmlGpmSampleGet", h)
        if h.gpm is None:
            raise _ERRORS["NotSupported"]()
        sample.gpu = h
        return sample

    def nvmlGpmSampleFree(self, sample) -> None:
        self._ready("nvmlGpmSampleFree")
        self.gpm_live -= 1

    def nvmlGpmMetricsGet(self, request):
        self._ready("nvmlGpmMetricsGet")
        gpu = request.sample2.gpu
        if request.sample1.gpu is not gpu or gpu is None:
            raise _ERRORS["InvalidArgument"]()
        for m in request.metrics[:request.numMetrics]:
            if m.metricId in gpu.gpm:
                m.nvmlReturn, m.value = 0, float(gpu.gpm[m.metricId])
            else:
                m.nvmlReturn = _CODES["NotSupported"]
        return request

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGpu, b: FakeGpu) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", a)
        if b.bus_id not in a.topology:
            raise _ERRORS["NotSupported"]()
        return a.topology[b.bus_id]

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", h)
        if link >= len(h.nvlinks):
            raise _ERRORS["NotSupported"]() if not h.nvlinks else _ERRORS["InvalidArgument"]()
        return int(bool(h.nvlinks[link]))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGpu, link: int):
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", h)
        return SimpleNamespace(busId=h.nvlinks[link].encode())

    # --- helpers ------------------------------------------------------------------------
    def _ready(self, fn: str) -> None:
        self.calls.append(fn)
        if self.initialised <= 0:
            raise _ERRORS["Uninitialized"]()

    def _check(self, fn: str, h: FakeGpu) -> None:
        self._ready(fn)
        if h.lost:
            raise _ERRORS["GpuIsLost"]()
        if fn in h.unsupported:
            raise _ERRORS["NotSupported"]()

    def _value(self, fn: str, h: FakeGpu, value):
        self._check(fn, h)
        if value is None:
            raise _ERRORS["NotSupported"]()
        return value

    def _s(self, text: str):
        return text.encode() if self.as_bytes else text


for _name, _cls in _ERRORS.items():
    setattr(FakeNvml, f"NVMLError_{_name}", _cls)
