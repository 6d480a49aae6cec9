"""What the telemetry sampler costs: its own CPU time at 4 Hz, against an idle thread's.

Two real processes spin on the CPU, mapped to CPU virtual devices cpu:0 and cpu:1; the
sampler reads them (and the host line) every 0.25 s for 20 s. Its thread measures itself
with time.thread_time(). A baseline thread runs the same Event.wait loop without sampling,
at the same time, so the difference is the cost of sampling alone.

    .venv/bin/python benchmarks/bench_sampler.py [--seconds 20] [--interval 0.25]

Not a test: it prints figures (target: under 1 % of one core).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

from gputui.core.devices import cpu_devices
from gputui.hw.sampler import Sampler


class IdleLoop(threading.Thread):
    """The baseline: the sampler's wait loop with nothing to do."""

    def __init__(self, interval: float):
        super().__init__(name="baseline", daemon=True)
        self.interval = interval
        self.stop_event = threading.Event()
        self.cpu_s = 0.0
        self.ticks = 0

    def run(self) -> None:
        t0 = time.thread_time()
        due = time.monotonic() + self.interval
        while not self.stop_event.wait(max(0.0, due - time.monotonic())):
            self.ticks += 1
            due += self.interval
            self.cpu_s = time.thread_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=0.25)
    args = ap.parse_args()

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)  # let both interpreters start spinning
        pids = {"cpu:0": busy[0].pid, "cpu:1": busy[1].pid}
        samples: list = []
        sampler = Sampler(cpu_devices(2), args.interval, samples.append, pids=lambda: pids)
        baseline = IdleLoop(args.interval)
        wall0 = time.monotonic()
        sampler.start()
        baseline.start()
        time.sleep(args.seconds)
        sampler.stop()
        baseline.stop_event.set()
        baseline.join()
        wall = time.monotonic() - wall0
    finally:
        for p in busy:
            p.kill()
            p.wait()

    rounds = sampler.samples_taken
    busy_cpu = [s.cpu_percent for s in samples if s.device.startswith("cpu:")][-2:]
    print(f"sampled {rounds} rounds x 3 devices (cpu:0, cpu:1, host) in {wall:.1f} s "
          f"at {1 / args.interval:.0f} Hz; last busy-process readings {busy_cpu} % CPU")
    print(f"sampler thread CPU: {sampler.cpu_time_s * 1000:.1f} ms = "
          f"{100 * sampler.cpu_time_s / wall:.3f} % of one core "
          f"({1e6 * sampler.cpu_time_s / max(rounds, 1):.0f} us per round)")
    print(f"baseline idle loop: {baseline.cpu_s * 1000:.1f} ms = "
          f"{100 * baseline.cpu_s / wall:.3f} % of one core ({baseline.ticks} ticks)")
    net = sampler.cpu_time_s - baseline.cpu_s
    print(f"cost of sampling alone: {100 * net / wall:.3f} % of one core (target < 1 %)")
    if sampler.last_error:
        print(f"sampler error seen: {sampler.last_error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
