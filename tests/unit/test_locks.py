"""Two of the same at once: a run being resumed and a sweep being run are held by an OS lock
(runs/runlock.py) that a second command meets at once and refuses in one line. The holder is
a real second process; a SIGKILLed holder leaves no stale lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputui import cli
from gputui.core.config import load_preset
from gputui.core.presets import resolve_preset
from gputui.runs import runlock

HOLD = """
import sys
from gputui.runs import runlock
lock = runlock.{how}
print("held", flush=True)
sys.stdin.read()
"""


def _holder(how: str) -> subprocess.Popen:
    """A process holding a lock (``how``: the runlock call), returned once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(how=how)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"  # waits as long as the start takes
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()  # SIGKILL: the kernel drops the lock with the process
    proc.communicate(timeout=30)


@pytest.mark.slow
def test_a_folder_being_resumed_is_refused_to_a_second_resume(tmp_path):
    """The launch itself takes the resumed folder's lock (not a check before it that two
    commands started together could both pass): refused, and nothing made."""
    from gputui.runs.launcher import launch

    old = tmp_path / "runs" / "old-run"
    old.mkdir(parents=True)
    (old / "checkpoint.pt").write_bytes(b"x")
    cfg = load_preset(resolve_preset("quickstart"), [("test", "run.resume_from", str(old)),
                                     ("test", "devices.spec", "cpu")])
    holder = _holder(f"claim({str(old)!r}, 'other-run')")
    try:
        with pytest.raises(runlock.InUse) as refused:
            launch(cfg, tmp_path / "runs")
        assert str(refused.value) == (f"run.resume_from: old-run is being resumed by run "
                                      f"other-run (gputui pid {holder.pid}); stop that run "
                                      f"first, then resume")
        assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["old-run"]
    finally:
        _kill(holder)
    lock = runlock.claim(old)  # the killed holder left no stale lock: it may be resumed
    assert lock is not None
    lock.release()


@pytest.mark.slow
def test_a_running_sweep_is_refused_to_the_same_sweep_started_again(tmp_path, capsys):
    """The same `gputui sweep` started while the first runs would resume it and run its
    points beside it; it is refused (one line, exit 2) and the manifest is untouched."""
    from gputui.cli.sweep import build
    from gputui.runs.sweep.runner import manifest_path

    runs = tmp_path / "runs"
    argv = ["sweep", "quickstart", "--devices", "cpu", "--strategies", "single",
            "--runs-dir", str(runs)]
    sweep, _ = build(cli.build_parser().parse_args(argv), runs)
    sweep.manifest.state = "interrupted"
    sweep.manifest.sessions = 1
    path = sweep.save()
    before = path.read_bytes()
    sweep_id = sweep.manifest.sweep_id
    holder = _holder(f"claim_sweep({str(runs)!r}, {sweep_id!r})")
    try:
        for again in (argv, ["sweep", "--resume", sweep_id, "--runs-dir", str(runs)]):
            assert cli.main(again) == 2
            assert capsys.readouterr().err == (
                f"gputui: error: sweep {sweep_id} is running (gputui pid {holder.pid}); wait "
                f"for it to end, stop it (Ctrl-C in its terminal), or pass --fresh to start "
                f"a separate sweep\n")
        assert manifest_path(runs, sweep_id).read_bytes() == before
        assert sorted(p.name for p in runs.iterdir()) == ["sweeps"]  # no point started
    finally:
        _kill(holder)
    resumed, note = build(cli.build_parser().parse_args(argv), runs)
    assert note.startswith(f"resuming unfinished sweep {sweep_id}")
    resumed.release()


def test_the_lock_file_names_its_holder(tmp_path):
    lock = runlock.hold(tmp_path, tmp_path.name)
    assert lock is not None
    try:
        assert runlock.hold(tmp_path, "x") is None  # a second hold, even in this process
        assert runlock.holder(tmp_path) == f"still running (gputui pid {os.getpid()})"
        lock.label("new-run")
        assert runlock.holder(tmp_path) == f"being resumed by run new-run (gputui pid " \
                                           f"{os.getpid()})"
    finally:
        lock.release()
    assert runlock.holder(tmp_path) is None
    assert Path(tmp_path / runlock.LOCK_NAME).is_file()
