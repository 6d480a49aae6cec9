#!/usr/bin/env python3
"""Smoke test of the real app in a real terminal: run `gputui` inside tmux, send keys, read
the screen with `tmux capture-pane`, and assert on what a user would see.

The journey: open the app with a small preset, check the set-up screen, start the run with
Ctrl+R, wait for loss and samples/s on the run screen, stop it with `s`, see "stopped", quit
with Ctrl+Q, and check the run record on disk and that no training process is left.

Usage: python scripts/tui_smoke.py [--keep]   (exit 0 = passed; needs tmux)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOCKET = f"gputui-smoke-{os.getpid()}"  # a private tmux server: never touches the user's
SESSION = "smoke"
PRESET = """\
[run]
name = "smoke"
epochs = 30
log_every = 2
[model]
name = "lenet"
init = "default"
[data]
name = "synthetic"
train_size = 2000
test_size = 256
[optim]
batch_size = 128
lr = 0.1
[devices]
spec = "cpu*2"
[strategy]
name = "scratch"
"""


def tmux(*args: str, check: bool = True) -> str:
    out = subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait_for(pattern: str, timeout: float, what: str) -> str:
    """Poll the screen until ``pattern`` (a regex) shows up; fail with the screen."""
    deadline = time.monotonic() + timeout
    while True:
        text = screen()
        if re.search(pattern, text):
            print(f"ok: {what}")
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout:.0f} s: {what} ({pattern!r})\n"
                                 f"--- screen ---\n{text}")
        time.sleep(0.2)


def session_alive() -> bool:
    return subprocess.run(["tmux", "-L", SOCKET, "has-session", "-t", SESSION],
                          capture_output=True).returncode == 0


def _is_training(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"multiprocessing" in cmdline


def main() -> int:
    if shutil.which("tmux") is None:
        print("tmux is not installed (apt-get install -y tmux)", file=sys.stderr)
        return 2
    keep = "--keep" in sys.argv
    work = Path(tempfile.mkdtemp(prefix="gputui-smoke-"))
    runs = work / "runs"
    preset = work / "smoke.toml"
    preset.write_text(PRESET)
    # COLUMNS/LINES (set by some parents, e.g. pytest) would override the real pane size.
    cmd = (f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES "
           f"GPUTUI_RUNS_DIR={shlex.quote(str(runs))} "
           f"{shlex.quote(sys.executable)} -m gputui --preset {shlex.quote(str(preset))}")
    tmux("new-session", "-d", "-s", SESSION, "-x", "140", "-y", "44", cmd)
    try:
        wait_for(r"set-up · smoke", 20, "the set-up screen with the preset loaded")
        wait_for(r"Ready: scratch on cpu\*2", 5, "the set-up is valid")
        # The device table fills when discovery (NVML, psutil: a thread) answers, which on a
        # loaded machine comes after the form is valid: wait for it, never assume it is there.
        wait_for(r"cpu:1[\s\S]*CPU virtual device|CPU virtual device[\s\S]*cpu:1", 30,
                 "the device table lists the preset's CPU virtual devices")
        # the form's rows, and the footer's keys, come after the first paint
        text = wait_for(r"Learning rate[\s\S]*\^r Start run", 30, "the form and the footer's keys")
        assert "Start run (ctrl+r)" in text, "the Start button"
        tmux("send-keys", "-t", SESSION, "C-r")
        wait_for(r"● running", 60, "the run screen, running")
        wait_for(r"samples/s [\d,]+ ", 90, "samples/s from the real run")
        wait_for(r"Loss[\s\S]*┤", 10, "the loss plot has an axis")
        tmux("send-keys", "-t", SESSION, "s")
        wait_for(r"■ stopped", 60, "the run stopped")
        wait_for(r"status stopped", 10, "the record says stopped")
        tmux("send-keys", "-t", SESSION, "C-q")
        deadline = time.monotonic() + 15
        while session_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not session_alive(), "the app did not quit on Ctrl+Q"
        print("ok: the app quit")
        [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "stopped", summary
        print(f"ok: {run_dir.name}/summary.json says stopped")
        pids = {json.loads(line).get("pid") for line in
                (run_dir / "telemetry.jsonl").read_text().splitlines()} - {None}
        assert pids, "telemetry named no training process"
        alive = [pid for pid in pids if _is_training(pid)]
        assert not alive, f"training process(es) {alive} outlived the app"
        print(f"ok: training process(es) {sorted(pids)} are gone")
        print("smoke test passed")
        return 0
    except AssertionError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        tmux("kill-server", check=False)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
