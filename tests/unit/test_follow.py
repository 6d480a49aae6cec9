"""Following a run started elsewhere from its record (gputui.runs.follow): events as they are
written, whole lines only, the record's end, a writer gone without one, a writer on another
host judged by its heartbeat; never a write to the record. The writer is a real process
holding the run folder's lock (runlock.hold), as `gputui run` does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputui.core.config import RunConfig
from gputui.core.events import LogLine, RunFinished, RunStarted, Status, StepMetrics
from gputui.runs import runlock
from gputui.runs.follow import RecordFollower, clock

HOLDER = ("import sys, time\n"
          "from gputui.runs import runlock\n"
          "lock = runlock.hold(sys.argv[1], sys.argv[2])\n"
          "lock.beat(0.2)\n"
          "print('held', flush=True)\n"
          "time.sleep(600)\n")


@pytest.fixture
def holder(tmp_path):
    """A process holding a fresh run folder's lock, as a run's gputui process does."""
    run_dir = tmp_path / "20261128-070000-elsewhere-abcd"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), run_dir.name],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield run_dir, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def _started(run_id: str) -> RunStarted:
    return RunStarted(run_id=run_id, config=RunConfig().replace(run={"epochs": 1}),
                      devices=({"name": "cpu:0", "kind": "cpu", "label": ""},),
                      strategy="single")


def _step(n: int) -> StepMetrics:
    return StepMetrics(epoch=1, step=n, global_step=n, steps_per_epoch=10, loss=2.0 / n,
                       samples_per_s=100.0, step_time_s=0.1, lr=0.1)


def _append(run_dir: Path, text: str) -> None:
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as f:
        f.write(text)


def _files(run_dir: Path) -> dict:
    """Every file's size and modification time: what a write would change (the lock file
    aside: its holder, the writer, rewrites its heartbeat)."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.iterdir()
            if p.name != runlock.LOCK_NAME}


def _poll_until(follower: RecordFollower, done, timeout: float = 60.0) -> list:
    seen: list = []
    deadline = time.monotonic() + timeout  # a failure guard only
    while not done(seen) and time.monotonic() < deadline:
        seen += follower.poll(timeout=0.1)
    return seen


def test_a_record_is_followed_line_by_line_to_its_end_without_a_write(holder):
    run_dir, proc = holder
    follower = RecordFollower(run_dir)
    assert follower.started_here() == f"started elsewhere (gputui pid {proc.pid})"
    assert follower.poll() == [] and not follower.done  # no events file yet
    _append(run_dir, _started(run_dir.name).to_json() + "\n" + _step(1).to_json() + "\n")
    half = _step(2).to_json()
    _append(run_dir, half[:20])  # a line being written is not read until it ends
    before = _files(run_dir)
    got = _poll_until(follower, lambda seen: len(seen) >= 2)
    assert [e.kind for e in got] == ["run_started", "step"] and got[1].step == 1
    assert follower.poll(timeout=0.3) == [] and not follower.done  # the writer lives
    _append(run_dir, half[20:] + "\n")
    assert [e.step for e in _poll_until(follower, lambda seen: seen)] == [2]
    _append(run_dir, LogLine(level="info", message="last words").to_json() + "\n"
            + RunFinished(seconds=3.0).to_json() + "\n")
    got = _poll_until(follower, lambda seen: follower.done)
    assert [e.kind for e in got] == ["log", "run_finished"]
    assert follower.done and follower.terminal == got[-1] and follower.gone == ""
    assert follower.status is Status.FINISHED  # decided as the run's own handle decides it
    # the follower read the folder and its lock; it wrote nothing (the test's last append
    # aside, every file is as it was)
    after = _files(run_dir)
    after.pop("events.jsonl")
    before.pop("events.jsonl")
    assert after == before
    from gputui import cli

    assert cli.main(["watch", str(run_dir)]) == 0  # `gputui watch`: the run finished


def test_a_writer_killed_without_an_end_is_named_and_the_watch_ends(holder, capsys):
    run_dir, proc = holder
    _append(run_dir, _started(run_dir.name).to_json() + "\n" + _step(1).to_json() + "\n")
    follower = RecordFollower(run_dir)
    got = _poll_until(follower, lambda seen: len(seen) >= 2)
    last = got[-1].t
    before = _files(run_dir)
    os.kill(proc.pid, signal.SIGKILL)  # no end event, no release: the kernel frees the lock
    proc.wait(timeout=30)
    got = _poll_until(follower, lambda seen: follower.done)
    assert [e.kind for e in got] == ["run_failed"]
    assert got[0].reason == (f"no longer written since {clock(last)}, the writer gputui pid "
                             f"{proc.pid} is gone")
    assert follower.gone == got[0].reason and follower.status is Status.FAILED
    assert _files(run_dir) == before  # that end is shown, never recorded
    # `gputui watch` says it once, as the watch's end (exit 1: the run did not finish)
    from gputui import cli

    assert cli.main(["watch", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"started elsewhere (gputui pid {proc.pid}); read-only" in out
    assert f"ended: incomplete ({got[0].reason})" in out and "run failed" not in out
    assert _files(run_dir) == before


def _sigint_as_a_terminal_has_it() -> None:
    """SIGINT at its default in the command, whatever this test runner inherited (a runner
    started as a script's background job ignores it, and so would its children)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_watch_and_not_the_run(holder, sig):
    """`gputui watch` of a run whose writer lives, as its own command: Ctrl-C or SIGTERM
    ends the watch (128 + the signal, one line saying the run goes on); the writer lives.
    Sent once the watch has said it watches (its handlers are in place before that line).
    The loading's noting handler, left in place for commands outside the stop contract, had
    the watch note every one and go on. A hang-up: the terminal is gone, so is the line."""
    run_dir, proc = holder
    _append(run_dir, _started(run_dir.name).to_json() + "\n" + _step(1).to_json() + "\n")
    watch = subprocess.Popen([sys.executable, "-m", "gputui", "watch", str(run_dir)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, preexec_fn=_sigint_as_a_terminal_has_it)
    try:
        assert watch.stdout is not None
        first = watch.stdout.readline()
        assert "read-only" in first, first
        watch.send_signal(sig)
        out = watch.communicate(timeout=60)[0]
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(timeout=30)
    assert watch.returncode == 128 + sig, out
    if sig != signal.SIGHUP:
        assert out.strip().splitlines()[-1] == \
            "stopped watching (the run goes on where it runs)"
    assert "Traceback" not in out and proc.poll() is None  # the run's writer goes on


def test_a_folder_that_holds_no_record_is_no_run_to_watch(tmp_path, capsys):
    from gputui import cli

    (tmp_path / "notes").mkdir()
    assert cli.main(["watch", str(tmp_path / "notes")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a run's record" in err, err


def test_a_writer_on_another_host_is_judged_by_its_heartbeat(tmp_path):
    now = time.time()
    other = runlock._parse(f"4242 run-x\thost=node2-of-the-test beat={now - 1:.1f}", False)
    assert (other.pid, other.host, other.what) == (4242, "node2-of-the-test", "run-x")
    assert other.elsewhere and other.alive(now)  # lock unseen there, beat fresh: alive
    assert other.who() == "gputui pid 4242 on node2-of-the-test"
    assert not other.alive(now + runlock.BEAT_STALE_S)  # its beats stopped: gone
    here = runlock._parse(f"4242 run-x\thost={runlock.HOST} beat={now:.1f}", False)
    assert not here.alive(now)  # on this host, a free lock is a writer gone, beat or not
    # a lock that cannot be tested (a file system without flock): the pid, on this host
    assert runlock._parse(f"{os.getpid()} run-x\thost={runlock.HOST}", None).alive()
    old = runlock._parse("4242 run-x", True)  # an older lock file: no host, no beat
    assert old.alive() and old.beat is None and old.who() == "gputui pid 4242"
    # a held lock's beat moves on while its holder lives
    lock = runlock.hold(tmp_path, "run-y")
    assert lock is not None
    try:
        first = runlock.writer(tmp_path)
        assert first is not None and first.what == "run-y" and first.host == runlock.HOST
        lock.beat(0.05)
        deadline = time.monotonic() + 30  # a failure guard only
        while time.monotonic() < deadline:
            now_w = runlock.writer(tmp_path)
            if now_w is not None and now_w.beat != first.beat:
                break
            time.sleep(0.05)
        assert now_w is not None and now_w.beat is not None and first.beat is not None
        assert now_w.beat > first.beat
        # what a refused resume quotes still reads past the heartbeat's fields
        assert runlock.holder(tmp_path) == f"being resumed by run run-y (gputui pid {os.getpid()})"
    finally:
        lock.release()
