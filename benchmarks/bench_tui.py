#!/usr/bin/env python3
"""The app's speed, measured in a real terminal (tmux), with baselines from the same run.

1. Start-up: time from launching `gputui` to its first painted screen (the set-up screen's
   "Start run" visible in the pane). Baselines: `python -c pass` (the interpreter alone) and
   a bare Textual hello-world app to its first paint, measured the same way. Target < 0.5 s.
2. Keystroke-to-screen latency: Ctrl+P (the command palette) until it is on screen, then
   Escape until it is gone, on the run screen while a real run keeps both cores busy. Baseline:
   the same keys on the same screen once the run has stopped (the machine idle). Target
   < 100 ms.

Every figure is the median of several tries; times include tmux's own round trip (a
send-keys and capture-pane each take a few ms), so they are upper bounds.

Usage: python benchmarks/bench_tui.py [--tries N]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOCKET = f"gputui-bench-{os.getpid()}"
PY = sys.executable
HELLO = """\
from textual.app import App
from textual.widgets import Static

class Hello(App):
    def compose(self):
        yield Static("hello-bench-ready")

Hello().run()
"""
BUSY_PRESET = """\
[run]
name = "bench-busy"
epochs = 200
log_every = 5
[model]
name = "lenet"
init = "default"
[data]
name = "synthetic"
train_size = 12000
test_size = 500
[optim]
batch_size = 256
lr = 0.1
[devices]
spec = "cpu*2"
[strategy]
name = "scratch"
"""


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True,
                          text=True).stdout


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_text(session: str, text: str, present: bool = True, timeout: float = 30.0) -> float:
    """Seconds until ``text`` is (or is no longer) on the pane; polls as fast as tmux allows."""
    t0 = time.perf_counter()
    while (text in screen(session)) != present:
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"bench_tui: timed out waiting for {text!r} (present={present})\n"
                             f"{screen(session)}")
    return time.perf_counter() - t0


def launch(session: str, command: str, env: dict[str, str] | None = None) -> None:
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    full = f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {exports} {command}"
    tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "44", full)


def time_to_paint(command: str, marker: str, env: dict[str, str] | None = None) -> float:
    session = f"s{time.perf_counter_ns()}"
    t0 = time.perf_counter()
    launch(session, command, env)
    wait_text(session, marker)
    elapsed = time.perf_counter() - t0
    tmux("kill-session", "-t", session)
    return elapsed


def time_python_pass() -> float:
    t0 = time.perf_counter()
    subprocess.run([PY, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def keystroke_latency(session: str, tries: int) -> list[float]:
    """Ctrl+P until the palette shows, Escape until it is gone; both count as one sample."""
    out = []
    for _ in range(tries):
        t0 = time.perf_counter()
        tmux("send-keys", "-t", session, "C-p")
        wait_text(session, "Search for commands")
        out.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tmux("send-keys", "-t", session, "Escape")
        wait_text(session, "Search for commands", present=False)
        out.append(time.perf_counter() - t0)
        time.sleep(0.05)
    return out


def ms(x: float) -> str:
    return f"{x * 1000:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    env = {"GPUTUI_RUNS_DIR": str(work / "runs")}
    hello = work / "hello.py"
    hello.write_text(HELLO)
    preset = work / "busy.toml"
    preset.write_text(BUSY_PRESET)
    try:
        # Warm the file cache once so the first try is not an outlier of disk reads.
        time_to_paint(f"{PY} -m gputui", "Start run", env)
        py = statistics.median(time_python_pass() for _ in range(args.tries))
        bare = statistics.median(time_to_paint(f"{PY} {hello}", "hello-bench-ready")
                                 for _ in range(args.tries))
        app = statistics.median(time_to_paint(f"{PY} -m gputui", "Start run", env)
                                for _ in range(args.tries))
        print("start-up, launch to first painted screen (median of "
              f"{args.tries}, in tmux):")
        print(f"  python -c pass              {ms(py)}")
        print(f"  bare Textual hello world    {ms(bare)}")
        print(f"  gputui (set-up screen)      {ms(app)}   target < 500 ms: "
              f"{'met' if app < 0.5 else 'NOT met'}")
        print(f"  ratio gputui / bare Textual {app / bare:7.2f}x")

        session = "busy"
        launch(session, f"{PY} -m gputui --preset {shlex.quote(str(preset))}", env)
        wait_text(session, "Start run")
        tmux("send-keys", "-t", session, "C-r")
        wait_text(session, "samples/s", timeout=120)
        wait_text(session, "● running", timeout=120)
        time.sleep(3)  # past the first steps: both cores busy training
        load = os.getloadavg()[0]
        busy = keystroke_latency(session, args.tries * 2)
        tmux("send-keys", "-t", session, "s")
        wait_text(session, "■ stopped", timeout=120)
        time.sleep(2)
        idle = keystroke_latency(session, args.tries * 2)
        tmux("send-keys", "-t", session, "C-q")
        print(f"keystroke to screen (Ctrl+P / Escape on the run screen, {len(busy)} each):")
        print(f"  idle (run stopped)          median {ms(statistics.median(idle))}   "
              f"p90 {ms(statistics.quantiles(idle, n=10)[-1])}")
        print(f"  run active, 2 CPU devices   median {ms(statistics.median(busy))}   "
              f"p90 {ms(statistics.quantiles(busy, n=10)[-1])}   target < 100 ms: "
              f"{'met' if statistics.median(busy) < 0.1 else 'NOT met'}")
        print(f"  ratio busy / idle           {statistics.median(busy) / statistics.median(idle):7.2f}x"
              f"   (1-min load average while busy: {load:.1f} on {os.cpu_count()} cores)")
    finally:
        tmux("kill-server")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
