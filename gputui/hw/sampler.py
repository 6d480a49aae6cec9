"""The telemetry sampler: a daemon thread turning NVML and psutil readings into DeviceSamples.

What each sample holds (None = not available):
- ``cuda:N``: utilization, memory used/total, temperature, power and its limit from NVML; and,
  when ``pids()`` names the rank on it, that process's CPU % and resident memory.
- ``cpu:N`` (a CPU virtual device): the rank process's ``cpu_percent`` (100 = one core, as in
  top) and ``rss``; ``util`` is the same load as a share of the whole machine (0-100) and
  ``mem_used``/``mem_total`` are rss against host RAM, so generic bars work for every device.
  Several devices may share one process (the scratch strategy): each reports its figures.
- ``cpu`` (the host line, unless ``host=False``): total CPU % and RAM used/total.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from gputui.core.devices import Device
from gputui.core.events import DeviceSample
from gputui.hw import nvml
from gputui.hw.procstat import HostMeter, ProcessMeter, ProcReading

MIN_INTERVAL_S = 0.25
DEFAULT_INTERVAL_S = 1.0
HOST = "cpu"  # the device name of the host line ("cpu:N" are virtual devices)


class Sampler:
    """Samples the run's devices every ``interval_s`` seconds and hands each DeviceSample to
    ``emit`` (from the sampler thread). ``pids()`` maps device names to the pid training on
    them; it may grow while the run starts, and dead pids are skipped silently."""

    def __init__(self, devices: list[Device], interval_s: float,
                 emit: Callable[[DeviceSample], None],
                 pids: Callable[[], dict[str, int]] | None = None, host: bool = True):
        if not interval_s >= MIN_INTERVAL_S:  # also refuses NaN
            raise ValueError(f"the telemetry interval must be at least {MIN_INTERVAL_S} s, "
                             f"got {interval_s}")
        self.devices = list(devices)
        self.interval_s = float(interval_s)
        self._emit = emit
        self._pids = pids
        self._host = HostMeter() if host else None
        self._meters: dict[int, ProcessMeter] = {}
        self._dead: set[int] = set()  # never measure again: the pid may be reused
        self._uuids: dict[str, str] | None = None  # "cuda:N" -> NVML UUID, looked up once
        self._gpm_samples: dict[str, Any] = {}  # "cuda:N" -> its last GPM sample (None: no GPM)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_time_s = 0.0  # the sampler thread's own CPU time (its cost)
        self.samples_taken = 0
        self.last_error = ""  # the latest exception swallowed to keep the thread alive

    # --- thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread; the first samples come one interval later, so every CPU %
        in them covers a full interval."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gputui-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (promptly: it waits on an Event, not sleep)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)
        with self._lock:  # NVML holds the GPM samples' memory until they are freed
            for sample in self._gpm_samples.values():
                if sample is not None:
                    nvml.gpm_free(sample)
            self._gpm_samples.clear()

    @property
    def running(self) -> bool:
        """True while the sampler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        t0 = time.thread_time()
        due = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            try:
                for sample in self.sample_once():
                    self._emit(sample)
            except Exception as exc:  # noqa: BLE001 - telemetry must never stop a run
                self.last_error = f"{type(exc).__name__}: {exc}"
            self.cpu_time_s = time.thread_time() - t0
            # Fixed rate; after a stall (suspend, overload), resume without a burst.
            due += self.interval_s
            if due < time.monotonic():
                due = time.monotonic() + self.interval_s

    # --- sampling -------------------------------------------------------------------------
    def sample_once(self) -> list[DeviceSample]:
        """One frozen sample per device (plus the host line), read now."""
        with self._lock:
            pids = self._current_pids()
            readings: dict[int, ProcReading | None] = {}  # one read per process per sample
            host = self._host.read() if self._host else None
            out = []
            for dev in self.devices:
                pid = pids.get(dev.name)
                if pid is not None and pid not in readings:
                    readings[pid] = self._read_process(pid)
                proc = readings.get(pid) if pid is not None else None
                if dev.kind == "cuda":
                    out.append(self._gpu_sample(dev, proc))
                else:
                    out.append(self._cpu_sample(dev, proc, host))
            if host is not None:
                out.append(DeviceSample(
                    device=HOST, name=f"host CPU ({host.cores} cores)", util=host.cpu_percent,
                    cpu_percent=host.cpu_percent, mem_used=host.mem_used,
                    mem_total=host.mem_total))
            for pid in set(self._meters) - set(pids.values()):
                del self._meters[pid]  # no longer part of the run
            self.samples_taken += 1
            return out

    def _current_pids(self) -> dict[str, int]:
        if self._pids is None:
            return {}
        try:
            got = self._pids() or {}
        except Exception as exc:  # noqa: BLE001 - the launcher's view may be mid-update
            self.last_error = f"pids(): {type(exc).__name__}: {exc}"
            return {}
        return {name: int(pid) for name, pid in got.items() if pid}

    def _read_process(self, pid: int) -> ProcReading | None:
        if pid in self._dead:
            return None
        meter = self._meters.get(pid)
        if meter is None:
            try:
                meter = self._meters[pid] = ProcessMeter(pid)
            except psutil.Error:
                self._dead.add(pid)
                return None
        reading = meter.read()
        if reading is None:
            self._dead.add(pid)
            del self._meters[pid]
        return reading

    def _cpu_sample(self, dev: Device, proc: ProcReading | None, host) -> DeviceSample:
        cpu = proc.cpu_percent if proc else None
        cores = host.cores if host else (psutil.cpu_count() or 1)
        return DeviceSample(
            device=dev.name, name=dev.label or "CPU virtual device",
            util=None if cpu is None else round(min(100.0, cpu / cores), 1),
            mem_used=proc.rss if proc else None,
            mem_total=host.mem_total if host else psutil.virtual_memory().total,
            pid=proc.pid if proc else None, cpu_percent=None if cpu is None else round(cpu, 1),
            rss=proc.rss if proc else None)

    def _gpu_sample(self, dev: Device, proc: ProcReading | None) -> DeviceSample:
        if self._uuids is None:
            self._uuids = {f"cuda:{i}": g.uuid for i, g in enumerate(nvml.order().devices)} \
                if nvml.init() else {}
        uuid = self._uuids.get(dev.name)
        h = nvml.handle(uuid) if uuid else None
        r = nvml.read(h) if h is not None else nvml.GpuReading()
        energy = nvml.energy_mj(h) if h is not None else None
        gpm = self._gpm(dev.name, h) if h is not None else {}
        return DeviceSample(
            device=dev.name, name=dev.label, util=r.util, mem_used=r.mem_used,
            mem_total=r.mem_total, temp_c=r.temp_c, power_w=r.power_w,
            power_limit_w=r.power_limit_w, pid=proc.pid if proc else None,
            cpu_percent=None if proc is None or proc.cpu_percent is None
            else round(proc.cpu_percent, 1),
            rss=proc.rss if proc else None,
            energy_j=None if energy is None else energy / 1000.0, **gpm)

    def _gpm(self, device: str, h) -> dict[str, float]:
        """The GPM metrics since this device's previous sample (none on the first, or where
        the GPU has no GPM); the new sample is kept for the next."""
        if device not in self._gpm_samples:
            self._gpm_samples[device] = None if not nvml.gpm_supported(h) else nvml.gpm_sample(h)
            return {}
        earlier = self._gpm_samples[device]
        if earlier is None:
            return {}
        later = nvml.gpm_sample(h)
        if later is None:
            return {}
        self._gpm_samples[device] = later
        got = nvml.gpm_metrics(earlier, later)
        nvml.gpm_free(earlier)
        return {k: round(v, 1) for k, v in got.items()}
