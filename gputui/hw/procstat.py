"""CPU and memory figures from psutil: one training process, and the whole host.

CPU % is a rate, so each meter keeps its previous reading between samples. A process seen for
the first time reports its average since it started (so the first figure already means
something) and primes psutil for the rates that follow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ProcReading:
    """One process's CPU % (100 = one core busy, as in top) and resident memory in bytes."""

    pid: int
    cpu_percent: float | None
    rss: int | None


class ProcessMeter:
    """Measures one process; keeps its psutil.Process so cpu_percent is a rate between reads."""

    def __init__(self, pid: int):
        self.pid = pid
        self._proc = psutil.Process(pid)  # raises NoSuchProcess for a dead pid
        self._primed = False

    def read(self) -> ProcReading | None:
        """The process's figures, or None when it has exited (zombies count as exited)."""
        p = self._proc
        try:
            with p.oneshot():
                if p.status() == psutil.STATUS_ZOMBIE:
                    return None
                if self._primed:
                    cpu = p.cpu_percent(None)
                else:
                    # The first psutil rate would be 0.0 (nothing to compare with), so report
                    # the average since the process started and let psutil remember now.
                    times = p.cpu_times()
                    age = time.time() - p.create_time()
                    cpu = 100.0 * (times.user + times.system) / age if age > 0 else None
                    p.cpu_percent(None)
                    self._primed = True
                rss = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied:
            return ProcReading(self.pid, None, None)
        return ProcReading(self.pid, cpu, rss)


@dataclass(frozen=True)
class HostReading:
    """The whole machine: CPU busy % over the last interval, RAM used and total, cores."""

    cpu_percent: float | None
    mem_used: int
    mem_total: int
    cores: int


def _busy_total(t) -> tuple[float, float]:
    # psutil's own definition: guest time is already counted in user time on Linux, and
    # idle plus iowait is the CPU doing nothing.
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


class HostMeter:
    """Whole-machine CPU % (0-100 over all cores) and RAM, with its own previous reading so
    nobody else's call to psutil.cpu_percent() disturbs it."""

    MIN_WINDOW_S = 0.05  # shorter windows are dominated by the 10 ms tick granularity

    def __init__(self):
        self.cores = psutil.cpu_count() or 1
        self._last = _busy_total(psutil.cpu_times())
        self._last_t = time.monotonic()

    def read(self) -> HostReading:
        """CPU busy % since the previous read (None when that was too recent to measure)."""
        now_t = time.monotonic()
        busy, total = _busy_total(psutil.cpu_times())
        cpu = None
        if now_t - self._last_t >= self.MIN_WINDOW_S and total > self._last[1]:
            share = (busy - self._last[0]) / (total - self._last[1])
            cpu = round(min(100.0, max(0.0, 100.0 * share)), 1)
            self._last, self._last_t = (busy, total), now_t
        vm = psutil.virtual_memory()
        return HostReading(cpu, vm.total - vm.available, vm.total, self.cores)


def host_summary() -> dict:
    """CPU and RAM facts for `gputui devices`: cores, RAM used/total, load."""
    vm = psutil.virtual_memory()
    try:
        load = [round(x, 2) for x in psutil.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"cores_logical": psutil.cpu_count() or 1,
            "cores_physical": psutil.cpu_count(logical=False),
            "mem_used": vm.total - vm.available, "mem_total": vm.total,
            "cpu_percent": psutil.cpu_percent(interval=0.1), "load_avg": load}
