"""What else used the hardware while something was measured: the machine's state.

CPU: the other processes' share of the cores over the measured interval, from the whole
machine's busy CPU time less this process tree's own CPU time (this process, its children
alive or reaped, theirs), and the load average at the start and the end. GPU: the processes
on the run's devices that are not ours, and the devices' utilization, through the one NVML
module. A measurement is *contended* when others held at least ``CONTENDED`` of the cores,
or another process was on one of its GPUs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil

from gputui.core.machine import CONTENDED, note
from gputui.hw.procstat import HostMeter, _busy_total
from gputui.core.filewrite import WriteFailed, write_atomic
from gputui.core.machine import FILE



def _tree_cpu_s() -> float:
    """CPU seconds of this process and every descendant, reaped ones included (a
    monotone counter: a child's time moves into its parent's children_* when reaped)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        kids = []
    for p in kids:
        try:
            c = p.cpu_times()
        except psutil.Error:
            continue
        total += c.user + c.system + getattr(c, "children_user", 0.0) + \
            getattr(c, "children_system", 0.0)
    return total


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the system has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def busy_cores(window_s: float = 0.3) -> float | None:
    """The cores the whole machine kept busy over the next ``window_s`` seconds (from its
    CPU times; None where it has none): what runs now, where the 1-minute load average
    still holds work that ended up to a few minutes ago (a plan's own tracing children, just
    reaped): :class:`HostMeter`'s busy share over the window, in cores."""
    try:
        meter = HostMeter()
        time.sleep(window_s)
        share = meter.read().cpu_percent
    except (OSError, AttributeError):
        return None
    return None if share is None else round(share / 100 * meter.cores, 2)


class LoadWatch:
    """Started before a measurement, read after it: ``state()`` is the machine's state over
    the interval between (a plain dict, JSON-ready)."""

    def __init__(self, gpus: tuple[str, ...] = ()):
        self.gpus = tuple(gpus)  # NVML UUIDs of the devices measured
        self.cores = psutil.cpu_count() or 1
        self.t0 = time.time()
        self._m0 = time.monotonic()
        self._busy0 = _busy_total(psutil.cpu_times())[0]
        self._own0 = _tree_cpu_s()
        self.load_start = load_average()

    def state(self) -> dict[str, Any]:
        """{"when", "host", "seconds", "cores", "others_share", "others_cores", "load_start",
        "load_end", "gpu_others", "gpu_util", "contended", "note"}."""
        wall = max(1e-6, time.monotonic() - self._m0)
        busy = _busy_total(psutil.cpu_times())[0] - self._busy0
        own = _tree_cpu_s() - self._own0
        share = min(1.0, max(0.0, (busy - own) / (wall * self.cores)))
        gpu_others, gpu_util = _gpu_state(self.gpus)
        out = {"when": self.t0, "host": _host(), "seconds": round(wall, 3),
               "cores": self.cores, "others_share": round(share, 3),
               "others_cores": round(share * self.cores, 2), "load_start": self.load_start,
               "load_end": load_average(), "gpu_others": gpu_others, "gpu_util": gpu_util}
        out["contended"] = share >= CONTENDED or bool(gpu_others)
        out["note"] = note(out)
        return out


def write_state(run_dir: Path, watch: LoadWatch) -> None:
    """The machine's state over ``watch``'s interval as the run's machine.json; a write that
    fails leaves the run's figures without one (and they say so), never the run failed."""
    import json

    try:
        write_atomic(run_dir / FILE, json.dumps(watch.state(), indent=2) + "\n")
    except (OSError, WriteFailed):
        pass


def gpu_uuids(devices: list) -> tuple[str, ...]:
    """The NVML UUIDs of a run's CUDA devices (none when NVML is not there)."""
    wanted = [d.index for d in devices if getattr(d, "kind", "") == "cuda"]
    if not wanted:
        return ()
    from gputui.hw import nvml

    if not nvml.init():
        return ()
    found = nvml.order().devices
    return tuple(found[i].uuid for i in wanted if i < len(found))


def _host() -> str:
    return os.uname().nodename if hasattr(os, "uname") else ""


def _gpu_state(uuids: tuple[str, ...]) -> tuple[list[dict], list]:
    """Processes on those GPUs that are not this tree's, and each GPU's utilization %."""
    if not uuids:
        return [], []
    from gputui.hw import nvml

    if not nvml.init():
        return [], []
    ours = {os.getpid()}
    try:
        ours |= {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        pass
    others: list[dict] = []
    util: list = []
    for uuid in uuids:
        h = nvml.handle(uuid)
        if h is None:
            util.append(None)
            continue
        util.append(nvml.read(h).util)
        others += [{"pid": p.pid, "name": p.name, "mem": p.used_mem, "gpu": uuid}
                   for p in nvml.processes(h) if p.pid not in ours]
    return others, util
