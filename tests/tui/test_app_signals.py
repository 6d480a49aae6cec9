"""The real app in a real terminal (tmux) with a real run, ended the ways real life ends it:
`tmux kill-session` (the terminal closes: SIGHUP to the app's process group) and SIGTERM to
the group (systemd, docker stop, a scheduler). The run stops gracefully, its record names the
signal, it has a checkpoint, and no process is left."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gputui.core.runstore import read_events
from procs import tagged

ROOT = Path(__file__).resolve().parents[2]
PRESET = """[run]
name = "sig"
epochs = 30
log_every = 2
[data]
train_size = 3000
test_size = 200
[devices]
spec = "cpu*2"
[strategy]
name = "scratch"
[telemetry]
enabled = false
"""


def _tmux(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("how", ["kill-session", "sigterm"])
def test_the_app_stops_its_run_gracefully_on_a_signal(tmp_path, how):
    sock, tag = f"gputui-sig-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    runs, preset = tmp_path / "runs", tmp_path / "sig.toml"
    preset.write_text(PRESET)
    cmd = (f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES GPUTUI_TEST_TAG={tag} "
           f"GPUTUI_RUNS_DIR={shlex.quote(str(runs))} {shlex.quote(sys.executable)} -m gputui "
           f"--preset {shlex.quote(str(preset))}")
    assert _tmux(sock, "new-session", "-d", "-s", "s", "-x", "140", "-y", "44", cmd).returncode == 0
    try:
        _wait(lambda: "Ready: scratch" in _tmux(sock, "capture-pane", "-p", "-t", "s").stdout,
              30, "the set-up screen")
        _tmux(sock, "send-keys", "-t", "s", "C-r")
        run_dir = _wait(lambda: next((p.parent for p in runs.glob("*/events.jsonl")
                                      if any(e.kind == "step" for e in read_events(p.parent))),
                                     None), 120, "the run's first step")
        app = next(p for p in tagged(tag) if "-m gputui" in " ".join(p.cmdline()))
        if how == "kill-session":
            _tmux(sock, "kill-session", "-t", "s")
            expected = "stopped by SIGHUP (the terminal closed)"
        else:  # the pane's shell is in the group too and dies: the exit status is tested below
            os.killpg(os.getpgid(app.pid), signal.SIGTERM)
            expected = "stopped by SIGTERM"
        try:
            _wait(lambda: not tagged(tag), 60, "every process of the app to end")
        except AssertionError as exc:  # name who is left, and in what state
            left = [(p.pid, p.status(), p.ppid(), p.num_threads(),
                     [f.path for f in p.open_files()], " ".join(p.cmdline())[:100])
                    for p in tagged(tag)]
            raise AssertionError(f"{exc}: {left}") from None
        last = read_events(run_dir)[-1]
        if last.kind != "run_finished":  # 30 epochs before the signal: nothing to stop
            assert (last.kind, last.reason) == ("run_stopped", expected), last
            assert (run_dir / "checkpoint.pt").is_file()
            assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    finally:
        _tmux(sock, "kill-server")
        for p in tagged(tag):
            p.kill()


async def test_a_stop_signal_stops_the_run_and_the_app_exits_128_plus_it(presets):
    """The app's handler (what the event loop calls on SIGTERM): the run is asked to stop
    with the signal named, the app leaves when it has stopped, with status 143."""
    from scripted import ScriptedLauncher, fixed_inventory, wait_until

    from gputui.tui.app import make_app
    from gputui.tui.screens.run import RunScreen

    launcher = ScriptedLauncher()
    app = make_app(preset="quickstart", launcher=launcher, inventory=fixed_inventory(),
                   presets=presets)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        app.on_stop_signal(signal.SIGTERM)
        await wait_until(pilot, lambda: not app.is_running, what="the app to leave")
    assert launcher.handles[0].stop_reason == "stopped by SIGTERM"
    assert launcher.handles[0].kill_calls == 0
    assert app.return_code == 128 + signal.SIGTERM


async def test_a_signal_noted_before_the_app_took_the_signals_is_acted_on(presets):
    """A stop signal between the command line's handlers and the app's own (the command line
    notes it for the app, whose terminal is already in application mode): the app leaves
    with 128 + it as soon as it takes the signals, not never, nor killed mid-draw."""
    from scripted import ScriptedLauncher, fixed_inventory, wait_until

    from gputui.core import signals
    from gputui.tui.app import make_app

    app = make_app(preset="quickstart", launcher=ScriptedLauncher(), inventory=fixed_inventory(),
                   presets=presets)
    signals.NOTED_FOR_APP[:] = [signal.SIGTERM]
    try:
        async with app.run_test(size=(140, 44)) as pilot:
            await wait_until(pilot, lambda: not app.is_running, what="the app to leave")
    finally:
        signals.NOTED_FOR_APP.clear()
    assert app.return_code == 128 + signal.SIGTERM


async def test_a_crash_stops_the_run_gracefully_and_leaves_one_line(tmp_path, presets):
    """An exception nothing handles ends the app: the run is asked to stop with the crash as
    the reason, the traceback goes to runs/app-crash.log, status 1 and one line."""
    from scripted import ScriptedLauncher, fixed_inventory, wait_until

    from gputui.tui.app import make_app
    from gputui.tui.lifecycle import crash_line
    from gputui.tui.screens.run import RunScreen

    launcher = ScriptedLauncher()
    app = make_app(preset="quickstart", runs_dir=tmp_path / "runs", launcher=launcher,
                   inventory=fixed_inventory(), presets=presets)
    with pytest.raises(ZeroDivisionError):
        async with app.run_test(size=(140, 44)) as pilot:
            await pilot.pause()
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run")
            app.call_later(lambda: 1 / 0)  # a bug in a handler
            await pilot.pause(0.5)
    assert app.return_code == 1
    assert launcher.handles[0].stop_reason == "stopped: the app crashed: ZeroDivisionError: " \
                                              "division by zero"
    assert "ZeroDivisionError" in (tmp_path / "runs" / "app-crash.log").read_text()
    assert crash_line(app._exception) == ("gputui: error: the app crashed: ZeroDivisionError: "
                                          "division by zero")
