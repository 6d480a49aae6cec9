"""The sampler on real processes (psutil) and on a fake NVML: figures, dead pids, the thread."""

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from gputui.core.devices import Device, cpu_devices
from gputui.core.events import DeviceSample
from gputui.hw import nvml
from fakes.nvml import FakeGpu, FakeNvml
from gputui.hw.sampler import HOST, Sampler

BUSY = "while True: pass"
IDLE = "import time; time.sleep(120)"
# A spinning process gets a whole core on an idle machine and a sliver on a loaded one (load
# 20 on 2 cores gave it 6 %), so the busy figures are checked against what the kernel says the
# process used in the same window, not against a share a machine may not give.
IDLE_MAX = 5.0


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


class Window:
    """Brackets a reading: the kernel's CPU seconds of ``pid`` and the wall clock just before
    and just after the reading's start and end, so the true percent over the sampler's own
    window lies between ``low`` and ``high`` (plus the clock tick of /proc's figures)."""

    TICK = 100 / os.sysconf("SC_CLK_TCK")  # one tick of CPU time, in percent of a second

    def __init__(self, pid: int):
        self.pid = pid
        self.outer = (cpu_s(pid), time.monotonic())

    def start(self) -> None:
        self.inner = (cpu_s(self.pid), time.monotonic())

    def stop(self) -> None:
        self.inner_end = (cpu_s(self.pid), time.monotonic())

    def end(self) -> None:
        self.outer_end = (cpu_s(self.pid), time.monotonic())

    def holds(self, percent: float) -> bool:
        cpu_in = self.inner_end[0] - self.inner[0]
        cpu_out = self.outer_end[0] - self.outer[0]
        wall_in = max(self.inner_end[1] - self.inner[1], 1e-3)
        wall_out = self.outer_end[1] - self.outer[1]
        slack = 4 * self.TICK / wall_in  # both readings' ticks, and the sampler's
        return 100 * cpu_in / wall_out - slack <= percent <= 100 * cpu_out / wall_in + slack


@pytest.fixture
def spawn():
    """Start real python processes; every one is killed and reaped afterwards."""
    procs: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def by_device(samples):
    return {s.device: s for s in samples}


def test_busy_and_idle_processes_on_cpu_virtual_devices(spawn):
    busy0, busy1, idle = spawn(BUSY), spawn(BUSY), spawn(IDLE)
    time.sleep(0.6)  # let the interpreters start, so lifetime averages settle too
    pids = {"cpu:0": busy0.pid, "cpu:1": busy1.pid, "cpu:2": idle.pid}
    s = Sampler(cpu_devices(3), 0.25, emit=lambda _: None, pids=lambda: pids)
    born = {p.pid: psutil.Process(p.pid).create_time() for p in (busy0, busy1)}
    lifetime = {pid: (cpu_s(pid), time.time()) for pid in born}
    windows = {pid: Window(pid) for pid in born}
    first = by_device(s.sample_once())
    # The first reading is the average since the process started, not psutil's 0.0: between
    # the kernel's figures of just before and just after it
    for name, pid in (("cpu:0", busy0.pid), ("cpu:1", busy1.pid)):
        before, at = lifetime[pid]
        after, later = cpu_s(pid), time.time()
        tick = 2 * Window.TICK / (at - born[pid])
        assert 100 * before / (later - born[pid]) - tick <= first[name].cpu_percent \
            <= 100 * after / (at - born[pid]) + tick, (first[name], before, after)
    for w in windows.values():
        w.start()
    time.sleep(0.5)
    for w in windows.values():
        w.stop()
    got = by_device(s.sample_once())
    for w in windows.values():
        w.end()
    cores = psutil.cpu_count()
    for name, pid in (("cpu:0", busy0.pid), ("cpu:1", busy1.pid)):
        sample = got[name]
        assert sample.pid == pid
        # what the kernel says the spinning loop used in the sampler's window, however
        # little of a core this machine's load left it
        assert windows[pid].holds(sample.cpu_percent), (sample, vars(windows[pid]))
        assert sample.util == pytest.approx(min(100.0, sample.cpu_percent / cores), abs=0.1)
        assert sample.rss > 1024**2 and sample.mem_used == sample.rss
        assert sample.mem_total == psutil.virtual_memory().total
    assert got["cpu:2"].cpu_percent < IDLE_MAX and got["cpu:2"].rss > 1024**2  # asleep
    host = got[HOST]
    # The host line is a share of ALL cores: two spinning processes are 100 % of 2 cores but
    # about 3 % of 64. In cores, it holds at least most of what the two busy ones used.
    busy_cores = (got["cpu:0"].cpu_percent + got["cpu:1"].cpu_percent) / 100
    assert host.cpu_percent / 100 * cores > 0.5 * busy_cores, (host, busy_cores, cores)
    assert 0 < host.mem_used < host.mem_total
    assert [x.device for x in s.sample_once()] == ["cpu:0", "cpu:1", "cpu:2", HOST]


def test_dead_and_zombie_pids_are_skipped(spawn):
    live, zombie, reaped = spawn(BUSY), spawn(IDLE), spawn(IDLE)
    time.sleep(0.3)
    pids = {"cpu:0": live.pid, "cpu:1": zombie.pid, "cpu:2": reaped.pid}
    s = Sampler(cpu_devices(3), 0.25, emit=lambda _: None, pids=lambda: pids)
    assert all(x.rss for x in s.sample_once() if x.device != HOST)
    zombie.kill()  # not waited for: stays a zombie, psutil still finds the pid
    reaped.kill()
    reaped.wait(timeout=10)
    time.sleep(0.3)
    got = by_device(s.sample_once())
    for name in ("cpu:1", "cpu:2"):
        assert (got[name].pid, got[name].cpu_percent, got[name].rss) == (None, None, None)
    assert got["cpu:0"].pid == live.pid and got["cpu:0"].cpu_percent is not None
    pids["cpu:3"] = 2**22 + 4321  # beyond pid_max: never existed
    s.devices.append(Device("cpu", 3, "CPU virtual device"))
    assert by_device(s.sample_once())["cpu:3"].rss is None


def test_devices_sharing_one_process_report_the_same_real_figures(spawn):
    # The scratch strategy runs every replica in one process; reading it once per device
    # would leave the second device a near-zero interval and a bogus CPU %.
    busy = spawn(BUSY)
    time.sleep(0.3)
    s = Sampler(cpu_devices(2), 0.25, emit=lambda _: None,
                pids=lambda: {"cpu:0": busy.pid, "cpu:1": busy.pid}, host=False)
    window = Window(busy.pid)
    s.sample_once()
    window.start()
    time.sleep(0.4)
    window.stop()
    a, b = s.sample_once()
    window.end()
    assert (a.device, b.device) == ("cpu:0", "cpu:1")
    assert a.cpu_percent == b.cpu_percent and a.rss == b.rss > 0
    assert window.holds(a.cpu_percent), (a, vars(window))  # the process's, not a sliver


def test_pids_that_appear_late_or_fail(spawn):
    busy = spawn(BUSY)
    mapping: dict = {}
    calls = {"n": 0}

    def pids():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("launcher mid-update")
        return mapping
    s = Sampler(cpu_devices(1), 0.25, emit=lambda _: None, pids=pids, host=False)
    assert s.sample_once()[0].pid is None  # no rank yet
    assert s.sample_once()[0].pid is None and "launcher mid-update" in s.last_error
    mapping["cpu:0"] = busy.pid
    assert s.sample_once()[0].pid == busy.pid


def test_thread_emits_and_stops_promptly(spawn):
    busy = spawn(BUSY)
    got: list[DeviceSample] = []
    threads = set()

    def emit(sample):
        threads.add(threading.current_thread().name)
        got.append(sample)
    s = Sampler(cpu_devices(1), 0.25, emit, pids=lambda: {"cpu:0": busy.pid})
    s.start()
    time.sleep(1.2)
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 0.3  # Event.wait wakes at once, no sleep to sit out
    assert not s.running
    rounds = len(got) // 2  # cpu:0 and the host line
    assert 3 <= rounds <= 5  # every 0.25 s, the first one interval after start
    assert threads == {"gputui-sampler"}
    assert all(x.cpu_percent is not None for x in got)
    assert s.cpu_time_s > 0 and s.samples_taken == rounds
    n = len(got)
    time.sleep(0.4)
    assert len(got) == n  # nothing after stop


def test_failing_emit_does_not_kill_the_thread():
    calls = {"n": 0}

    def emit(sample):
        calls["n"] += 1
        raise OSError("queue closed")
    s = Sampler([], 0.25, emit)
    s.start()
    time.sleep(0.7)
    s.stop()
    assert calls["n"] >= 2 and s.last_error == "OSError: queue closed"


def test_interval_minimum():
    with pytest.raises(ValueError) as err:
        Sampler([], 0.1, emit=print)
    assert str(err.value) == "the telemetry interval must be at least 0.25 s, got 0.1"
    with pytest.raises(ValueError):
        Sampler([], float("nan"), emit=print)


@pytest.fixture
def fake_gpus(monkeypatch):
    gpus = [FakeGpu("NVIDIA A100", "GPU-aaaa", "00000000:1A:00.0", util=11, temp=50),
            FakeGpu("NVIDIA T4", "GPU-bbbb", "00000000:3B:00.0", util=77, temp=61,
                    mem_used=3 * 1024**3, power_mw=65_500, limit_mw=70_000)]
    nvml.use_module(FakeNvml(gpus))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # cuda:0 of the run is NVML's GPU 1
    yield gpus
    nvml.use_module(None)


def test_gpu_samples_follow_cuda_numbering(fake_gpus):
    s = Sampler([Device("cuda", 0, "NVIDIA T4")], 0.25, emit=lambda _: None,
                pids=lambda: {"cuda:0": os.getpid()}, host=False)
    (sample,) = s.sample_once()
    assert (sample.device, sample.name, sample.util, sample.temp_c, sample.mem_used) == \
        ("cuda:0", "NVIDIA T4", 77.0, 61.0, 3 * 1024**3)
    assert sample.power_w == pytest.approx(65.5) and sample.power_limit_w == pytest.approx(70.0)
    assert sample.pid == os.getpid() and sample.rss > 0
    fake_gpus[1].util, fake_gpus[1].temp = 5, None  # live values change; temp vanishes
    (sample,) = s.sample_once()
    assert (sample.util, sample.temp_c) == (5.0, None)


def test_gpu_samples_without_driver_are_not_available():
    nvml.use_module(FakeNvml([], init_error=FakeNvml.NVMLError_DriverNotLoaded))
    try:
        s = Sampler([Device("cuda", 0)], 0.25, emit=lambda _: None, host=False)
        (sample,) = s.sample_once()
        assert sample.device == "cuda:0"
        assert (sample.util, sample.mem_used, sample.temp_c, sample.power_w) == \
            (None, None, None, None)
    finally:
        nvml.use_module(None)
