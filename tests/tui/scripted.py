"""A scripted stand-in for the launcher's RunHandle, and fixed event streams.

``FakeHandle`` honours the launcher's contract: ``poll`` never blocks longer than its timeout,
``stop``/``kill`` make a terminal event arrive, ``done`` turns true once poll delivered it.
Every value (timestamps included) is fixed, so what the screens show is deterministic.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gputui.core import breakdown
from gputui.core.config import RunConfig
from gputui.core.devices import Device, cpu_devices
from gputui.core.events import (
    DeviceStep,
    DeviceSample,
    EpochEnd,
    Event,
    FlopsInfo,
    InitDone,
    LogLine,
    MemoryReport,
    MemoryRow,
    RunFailed,
    RunFinished,
    RunStarted,
    RunStopped,
    StepMetrics,
    is_terminal,
)
from gputui.tui.inventory import DeviceRow, Inventory

T0 = 1_700_000_000.0
GIB = 1024 ** 3


def fixed_inventory(gpus: int = 0) -> Inventory:
    """No discovery: a host with 2 cores and optionally some GPUs."""
    rows = tuple(DeviceRow("cuda", i, "NVIDIA A100-SXM4-40GB", "1.0 GiB / 40.0 GiB", "3%",
                           "free") for i in range(gpus))
    from gputui.core.devices import GpuInfo

    infos = tuple(GpuInfo(i, "NVIDIA A100-SXM4-40GB") for i in range(gpus))
    reason = "" if gpus else "no NVIDIA driver could be loaded (NVML Shared Library Not Found)"
    return Inventory(rows, reason, "5.0 GiB / 23.4 GiB host", "12% host", 2, infos)


def step_parts(device: int) -> breakdown.Breakdown:
    """A fixed 100 ms step of scratch on CPU virtual devices: 40 ms of this device's compute,
    10 ms allreduce, 8 ms update, 2 ms data, the other device's 38 (or 40) ms as wait."""
    return breakdown.make(span_s=0.098, data_s=0.002, compute_s=0.04, optimizer_s=0.008,
                          comm_exposed_s=0.01, comm_overlap_s=0.0,
                          wait_s=0.038 if device == 0 else 0.04)


def run_events(run_id: str = "20240101-000000-quickstart", devices: int = 2, epochs: int = 3,
               steps_per_epoch: int = 20, log_every: int = 5, end: str = "finished",
               end_after_epochs: int | None = None) -> list[Event]:
    """A whole run's events with fixed numbers (loss falls, accuracy rises)."""
    devs = tuple(Device("cpu", i, "CPU virtual device").to_dict() for i in range(devices))
    cfg = RunConfig().replace(run={"epochs": epochs, "name": "quickstart"},
                              strategy={"name": "scratch"})
    out: list[Event] = [
        RunStarted(run_id=run_id, config=cfg, devices=devs, strategy="scratch",
                   world_size=1, notes=("CPU virtual devices share 2 cores",), t=T0),
        LogLine(level="info", message="torch 2.14.1, 2 threads", t=T0 + 1.0),
        InitDone(seconds=2.5, import_s=1.5, data_s=0.5, model_s=0.2, train_samples=12000,
                 test_samples=2000, steps_per_epoch=steps_per_epoch, params=61706, t=T0 + 2.5),
    ]
    t, gstep = T0 + 2.5, 0
    last_epoch = epochs if end_after_epochs is None else end_after_epochs
    for epoch in range(1, last_epoch + 1):
        for step in range(log_every, steps_per_epoch + 1, log_every):
            gstep = (epoch - 1) * steps_per_epoch + step
            t += 0.5
            rows = tuple(DeviceStep(f"cpu:{i}", samples=128, compute_s=0.04,
                                    breakdown=step_parts(i)) for i in range(devices))
            out.append(StepMetrics(epoch=epoch, step=step, global_step=gstep,
                                   steps_per_epoch=steps_per_epoch, loss=2.3 / (1 + 0.1 * gstep),
                                   samples_per_s=5000.0 + 10 * gstep, step_time_s=0.1,
                                   lr=0.1, per_device=rows, flops_per_s=3.4e10, mfu=0.31,
                                   breakdown=breakdown.mean(r.breakdown for r in rows), t=t))
            for i in range(devices):
                out.append(DeviceSample(device=f"cpu:{i}", name="CPU virtual device",
                                        cpu_percent=80.0 + i + (gstep % 7), rss=(1 + i) * GIB // 2,
                                        mem_total=8 * GIB, pid=4242 + i, t=t))
            if gstep == log_every:  # what the loop records with the first step
                out.append(FlopsInfo(flops_per_step=3_394_252_800, peak_flops=1.1e11,
                                     units=devices, source="a CPU, measured matmul", t=t))
                out.append(MemoryReport(epoch=1, per_device=tuple(
                    MemoryRow(device=f"cpu:{i}", params=246_824, grads=246_824, optim=246_824,
                              activations=17_645_572) for i in range(devices)), t=t))
        t += 0.4
        out.append(EpochEnd(epoch=epoch, epochs=epochs, seconds=2.0, train_loss=1.0 / epoch,
                            test_acc=0.5 + 0.1 * epoch, samples_per_s=6000.0, eval_s=0.4, t=t))
    out.append(LogLine(level="warning", message="DataParallel has no CPU mode", t=t + 0.1))
    if end == "finished":
        out.append(RunFinished(seconds=t - T0, t=t + 0.2))
    elif end == "stopped":
        out.append(RunStopped(t=t + 0.2))
    elif end == "failed":
        out.append(RunFailed(reason="dataset 'mnist' not found in /nowhere; set data.root",
                             detail="Traceback: ...", t=t + 0.2))
    return out


class FakeHandle:
    """Plays scripted events through ``poll``; stop/kill append a terminal event."""

    def __init__(self, events: list[Event], *, chunk: int = 10_000,
                 hold_terminal: bool = False, run_id: str = "20240101-000000-quickstart",
                 run_dir: Path | None = None, devices: list[Device] | None = None) -> None:
        self.run_id = run_id
        self.run_dir = run_dir or Path("/nonexistent/runs") / run_id
        self.devices = devices if devices is not None else cpu_devices(2)
        self._events = list(events)
        self._chunk = chunk
        self._hold = hold_terminal  # keep running until stop/kill
        self._lock = threading.Lock()
        self._done = False
        self.stop_calls = 0
        self.kill_calls = 0
        self.polls = 0
        self._sampled: list[DeviceSample] = []

    def poll(self, timeout: float = 0.0, max_events: int = 10_000) -> list[Event]:
        self.polls += 1
        with self._lock:
            ready = [e for e in self._events[: min(self._chunk, max_events)]
                     if not (self._hold and is_terminal(e) and not self._stopping)]
            if not ready:
                pass
            else:
                del self._events[: len(ready)]
                if any(is_terminal(e) for e in ready):
                    self._done = True
                # the handle's second stream: the samples come through ``samples``
                self._sampled.extend(e for e in ready if isinstance(e, DeviceSample))
                return [e for e in ready if not isinstance(e, DeviceSample)]
        time.sleep(min(timeout, 0.05))
        return []

    def samples(self) -> list[DeviceSample]:
        out, self._sampled = self._sampled, []
        return out

    _stopping = False

    def stop(self, reason: str = "stopped by user") -> None:
        self.stop_calls += 1
        self.stop_reason = reason
        with self._lock:
            self._stopping = True
            self._events = [e for e in self._events if not is_terminal(e)]
            self._events.append(RunStopped(reason=reason, t=T0 + 100))

    def kill(self, reason: str = "killed by user") -> None:
        self.kill_calls += 1
        with self._lock:
            self._stopping = True
            # as the real launcher records a kill: stopped, marked killed
            self._events = [RunStopped(reason=reason, killed=True, t=T0 + 100)]

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> str:
        return "running" if not self._done else "finished"


class ScriptedLauncher:
    """launch(cfg, runs_dir) -> FakeHandle; records the configs it was given."""

    def __init__(self, make_handle=None, error: Exception | None = None) -> None:
        self.configs = []
        self.handles: list[FakeHandle] = []
        self.make_handle = make_handle or (lambda cfg: FakeHandle(run_events(), hold_terminal=True))
        self.error = error

    def __call__(self, cfg, runs_dir=None):
        self.configs.append(cfg)
        if self.error is not None:
            raise self.error
        handle = self.make_handle(cfg)
        self.handles.append(handle)
        return handle


async def wait_until(pilot, predicate, timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until ``predicate()`` holds; fail with ``what`` after ``timeout`` s.

    Waiting on every worker would never return while a run screen pumps a live run (its
    worker ends only with the run), so tests wait for what the user would see instead.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        await pilot.pause(0.05)


async def click_visible(pilot, selector: str) -> None:
    """Scroll a form field into view, as a user would, then click it (the form is taller than
    a 44-line terminal)."""
    pilot.app.screen.query_one(selector).scroll_visible(animate=False, immediate=True)
    await pilot.pause()
    await pilot.click(selector)
