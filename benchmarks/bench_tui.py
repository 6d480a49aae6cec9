#!/usr/bin/env python3
"""The app's speed, measured in a real terminal (tmux), with baselines from the same run.

1. Start-up: time from launching `gputui` to its first painted screen (the set-up screen's
   "Start run" visible in the pane), and until its form's fields show too (they are mounted
   after the first paint). Baselines: `python -c pass` (the interpreter alone) and a bare
   Textual hello-world app to its first paint, measured the same way. Target < 0.5 s.
2. Quit: time from Ctrl+Q on the idle set-up screen until the process has exited (its
   shell prints a marker), right after the first paint (the warm host is still importing
   torch) and 3 s later; the bare Textual app's Ctrl+Q measured the same way. Target < 0.5 s.
3. Keystroke-to-screen latency on the run screen while a real run keeps both cores busy:
   a character typed into the command palette until it shows, and Ctrl+P until the palette
   shows. Baselines: the same keys on the same screen once the run has stopped (the machine
   idle), and a key echoed by `cat` in tmux (the measuring floor). Target < 100 ms.

Every figure is the median of several tries; times include tmux's own round trip (a
send-keys and capture-pane each take a few ms), so they are upper bounds.

Usage: python benchmarks/bench_tui.py [--tries N] [--quick (start-up and quit only)]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
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
        time.sleep(0.003)  # each poll forks a tmux client: leave the CPU to the app
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"bench_tui: timed out waiting for {text!r} (present={present})\n"
                             f"{screen(session)}")
    return time.perf_counter() - t0


def launch(session: str, command: str, env: dict[str, str] | None = None) -> None:
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    # "|| sleep": a crash leaves its traceback on the pane for the timeout message.
    full = (f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {exports} {command} "
            f"|| sleep 60")
    tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "44", full)


def time_to_paint(command: str, marker: str, env: dict[str, str] | None = None,
                  then: str = "") -> float:
    """Seconds from launch until ``marker`` is on the pane (with ``then``: until that is on
    it too)."""
    session = f"s{time.perf_counter_ns()}"
    t0 = time.perf_counter()
    launch(session, command, env)
    wait_text(session, marker)
    if then:
        wait_text(session, then)
    elapsed = time.perf_counter() - t0
    tmux("kill-session", "-t", session)
    return elapsed


QUIT_MARK = "quit-bench-done"
FORM_MARK = "Learning rate"  # a field of the set-up's form


def time_to_quit(command: str, marker: str, env: dict[str, str] | None = None,
                 idle_s: float = 0.0) -> float:
    """Seconds from Ctrl+Q (``idle_s`` after the first paint) until the process has exited:
    the shell after it prints QUIT_MARK."""
    session = f"q{time.perf_counter_ns()}"
    launch(session, f"{command}; echo {QUIT_MARK}; sleep 30", env)
    wait_text(session, marker)
    time.sleep(idle_s)
    t0 = time.perf_counter()
    tmux("send-keys", "-t", session, "C-q")
    wait_text(session, QUIT_MARK)
    elapsed = time.perf_counter() - t0
    tmux("kill-session", "-t", session)
    return elapsed


def time_python_pass() -> float:
    t0 = time.perf_counter()
    subprocess.run([PY, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def keystroke_latency(session: str, tries: int) -> tuple[list[float], list[float]]:
    """Two kinds of keystroke, each until its effect is on the pane:
    - typing: one character into the command palette's search box (the box shows it and the
      command list is filtered), the everyday case;
    - a modal: Ctrl+P opening the palette, the heaviest key there is (Textual re-renders the
      whole screen behind a modal, dimmed)."""
    typing, modal = [], []
    letters = "bcdfghjklmnpqrstvwxy"
    for i in range(tries):
        t0 = time.perf_counter()
        tmux("send-keys", "-t", session, "C-p")
        wait_text(session, "Search for commands")
        modal.append(time.perf_counter() - t0)
        typed = "zqj"
        tmux("send-keys", "-t", session, "-l", typed)
        wait_text(session, typed)
        for k in range(3):
            typed += letters[(i * 3 + k) % len(letters)]
            t0 = time.perf_counter()
            tmux("send-keys", "-t", session, "-l", typed[-1])
            wait_text(session, typed)
            typing.append(time.perf_counter() - t0)
        tmux("send-keys", "-t", session, "Escape")
        wait_text(session, typed, present=False)
        time.sleep(0.05)
    return typing, modal


def echo_latency(tries: int) -> list[float]:
    """The floor of every figure here: a key sent to `cat` in tmux until its echo shows."""
    session = "echo"
    launch(session, "cat")
    time.sleep(0.3)
    out = []
    for i in range(tries):
        t0 = time.perf_counter()
        tmux("send-keys", "-t", session, f"k{i}z")
        wait_text(session, f"k{i}z")
        out.append(time.perf_counter() - t0)
    tmux("kill-session", "-t", session)
    return out


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) > 1 else xs[0]


def ms(x: float) -> str:
    return f"{x * 1000:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="start-up and quit only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    env = {"GPUTUI_RUNS_DIR": str(work / "runs")}
    hello = work / "hello.py"
    hello.write_text(HELLO)
    preset = work / "busy.toml"
    preset.write_text(BUSY_PRESET)
    # A session that lives throughout: killing the last session would stop the tmux server,
    # and a new session could race the dying one.
    launch("keepalive", "cat")
    try:
        # Warm the file cache once so the first try is not an outlier of disk reads.
        time_to_paint(f"{PY} -m gputui", "Start run", env)
        py = statistics.median(time_python_pass() for _ in range(args.tries))
        bare = statistics.median(time_to_paint(f"{PY} {hello}", "hello-bench-ready")
                                 for _ in range(args.tries))
        app = statistics.median(time_to_paint(f"{PY} -m gputui", "Start run", env)
                                for _ in range(args.tries))
        # the form's rows come after the first paint: until its fields show
        form = statistics.median(time_to_paint(f"{PY} -m gputui", "Start run", env,
                                               then=FORM_MARK) for _ in range(args.tries))
        # The app without the CLI in front (its parser imports every subcommand's module).
        bare_app = statistics.median(time_to_paint(f"{PY} -m gputui.tui", "Start run", env)
                                     for _ in range(args.tries))
        print("start-up, launch to first painted screen (median of "
              f"{args.tries}, in tmux):")
        print(f"  python -c pass              {ms(py)}")
        print(f"  bare Textual hello world    {ms(bare)}")
        print(f"  gputui (set-up screen)      {ms(app)}   target < 500 ms: "
              f"{'met' if app < 0.5 else 'NOT met'}")
        print(f"  gputui, the form filled in  {ms(form)}   (its rows come after the first "
              f"paint)")
        print(f"  python -m gputui.tui        {ms(bare_app)}   (the app without the CLI)")
        print(f"  ratio gputui / bare Textual {app / bare:7.2f}x")

        bare_quit = statistics.median(time_to_quit(f"{PY} {hello}", "hello-bench-ready")
                                      for _ in range(args.tries))
        app_quit = statistics.median(time_to_quit(f"{PY} -m gputui", "Start run", env)
                                     for _ in range(args.tries))
        app_quit_idle = statistics.median(time_to_quit(f"{PY} -m gputui", "Start run", env,
                                                       idle_s=3.0)
                                          for _ in range(args.tries))
        print(f"quit, Ctrl+Q to the process gone (median of {args.tries}, in tmux):")
        print(f"  bare Textual hello world    {ms(bare_quit)}")
        print(f"  gputui, at first paint      {ms(app_quit)}   target < 500 ms: "
              f"{'met' if app_quit < 0.5 else 'NOT met'} (its warm host still loading torch)")
        print(f"  gputui, idle 3 s            {ms(app_quit_idle)}   target < 500 ms: "
              f"{'met' if app_quit_idle < 0.5 else 'NOT met'}")
        if args.quick:
            return 0

        echo = statistics.median(echo_latency(args.tries * 2))
        session = "busy"
        launch(session, f"{PY} -m gputui --preset {shlex.quote(str(preset))}", env)
        wait_text(session, "Start run")
        tmux("send-keys", "-t", session, "C-r")
        wait_text(session, "samples/s", timeout=120)
        wait_text(session, "● running", timeout=120)
        time.sleep(3)  # past the first steps: both cores busy training
        load = os.getloadavg()[0]
        busy_typing, busy_modal = keystroke_latency(session, args.tries)
        tmux("send-keys", "-t", session, "s")
        wait_text(session, "■ stopped", timeout=120)
        time.sleep(2)
        idle_typing, idle_modal = keystroke_latency(session, args.tries)
        tmux("send-keys", "-t", session, "C-q")
        print(f"keystroke to screen on the run screen (median / p90; {len(busy_typing)} typed "
              f"keys, {len(busy_modal)} palette openings each):")
        print(f"  tmux round trip (cat echo)     {ms(echo)}   (the floor of these figures)")
        for label, idle, busy in (("typing a key", idle_typing, busy_typing),
                                  ("Ctrl+P (a modal)", idle_modal, busy_modal)):
            i_med, b_med = statistics.median(idle), statistics.median(busy)
            print(f"  {label:17} idle {ms(i_med)} / {ms(p90(idle))}   run active "
                  f"{ms(b_med)} / {ms(p90(busy))}   busy/idle {b_med / i_med:5.2f}x   "
                  f"target < 100 ms: {'met' if b_med < 0.1 else 'NOT met'}")
        print(f"  (1-min load average while busy: {load:.1f} on {os.cpu_count()} cores)")
    finally:
        tmux("kill-server")
        shutil.rmtree(work, ignore_errors=True)  # its runs, scripts and presets
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
