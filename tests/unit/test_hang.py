"""A hang named (gputui.core.hang, gputui.train.collectives): the diagnosis over the ranks'
collective counts, the threshold, the counter's bookkeeping, the flight-recorder dump by the
name each torch gives it (a small fake at the boundary for the older NCCL-only name: no GPU
here); then a real ddp run on two gloo ranks whose rank 1 is stopped (SIGSTOP), followed from
another process by `gputui watch`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from gputui.core import hang
from gputui.core.hang import KINDS, Ledger, RankState, diagnose, threshold
from gputui.core.runstore import read_events
from gputui.train.collectives import Counter, dump_trace, trace_env

GPUTUI = [sys.executable, "-m", "gputui"]


def _state(rank: int, entered: int, left: int, t: float, kind: str = "all-reduce",
           step: int = 210, process: str = "") -> RankState:
    return RankState(rank=rank, pid=100 + rank, step=step, entered=entered, left=left,
                     kind=kind, nbytes=4096, t_enter=t, t_left=t - 1, process=process)


def test_the_rank_that_never_entered_is_named_with_how_long_the_others_waited():
    now = 1000.0
    states = [_state(0, 1234, 1233, now - 120), _state(1, 1234, 1233, now - 121),
              _state(2, 1234, 1233, now - 120), _state(3, 1233, 1233, now - 125, step=210)]
    stall = diagnose(states, stall_s=60, now=now)
    assert stall is not None and stall.behind == (3,) and stall.waiting == (0, 1, 2)
    assert stall.message == "rank 3 never entered all-reduce #1234 of step 210; ranks 0-2 " \
                            "waited 121 s"
    assert diagnose(states, stall_s=130, now=now) is None  # not yet past the threshold
    moving = states[:3] + [_state(3, 1233, 1233, now - 5)]
    assert diagnose(moving, stall_s=60, now=now) is None  # rank 3 still computes: no hang
    idle = [_state(r, 7, 7, now - 500) for r in range(2)]
    assert diagnose(idle, stall_s=60, now=now) is None  # nobody waits: a long compute
    # ... unless a process no longer runs (tp's own collectives are not counted)
    idle[1] = _state(1, 7, 7, now - 500, process="gone", step=4)
    assert diagnose(idle, 60, now).message == ("rank 1 stopped in step 4 (its process, pid 101, "
                                               "is gone); rank 0 made no progress for 500 s")
    assert diagnose([_state(r, 7, 7, now - 500, process="gone") for r in range(2)], 60,
                    now) is None  # every rank exited: the job is ending, not hanging
    # ... nor when this node's ranks exited (a peer on another node failed first): the
    # other node's row, as last published, says nothing of its process
    from dataclasses import replace

    ended_here = [_state(0, 8, 8, now - 90, process="gone"),
                  replace(_state(1, 7, 7, now - 95), local=False)]
    assert diagnose(ended_here, 60, now) is None
    # another node's rank behind, seen from the node whose rank waits
    # (its publisher heard a second ago: alive, its counts are current)
    remote = [_state(0, 8, 7, now - 61),
              replace(_state(1, 7, 7, now - 62), local=False, heard=now - 1)]
    assert diagnose(remote, 60, now).message == ("rank 1 never entered all-reduce #8 of step "
                                                 "210; rank 0 waited 61 s")
    # ... but a rank of another node that stopped reporting is named as silent, not by its
    # stale counts (seen on the SLURM cluster: "rank 1 was still in all-reduce #1 of step 0"
    # for a rank frozen in step 2, a second after its last report)
    stale = [_state(0, 10, 9, now - 61, step=2),
             replace(_state(1, 1, 0, now - 70, step=0), local=False, heard=now - 9)]
    assert diagnose(stale, 60, now).message == (
        "rank 1 on another node went silent 9 s ago (last heard of in step 0): its process "
        "stopped, died or lost this node; rank 0 waited 61 s in all-reduce #10 of step 2")
    # ... unless a rank of this node is stopped: the other node's reports came through it
    # (seen on the SLURM cluster: the frozen rank's node named the other node's rank)
    frozen_here = [_state(1, 32, 31, now - 61, step=9, process="stopped"),
                   replace(_state(0, 1, 0, now - 70, step=0), local=False, heard=now - 9)]
    assert diagnose(frozen_here, 60, now).message == (
        "rank 1 entered all-reduce #32 of step 9 but its process, pid 101, is stopped")
    never = Ledger([0.0] * Ledger.size(2)).unheard([_state(0, 10, 9, now - 61, step=2)])
    stall = diagnose(never, 60, now)
    assert stall.behind == (1,) and stall.message == (
        "rank 1 on another node never reported to this node: its process stopped, died or "
        "lost this node before its first report; rank 0 waited 61 s in all-reduce #10 of "
        "step 2")
    # a pipeline stage waiting to receive: its peer never sent
    pipe = [_state(0, 52, 51, now - 61, kind="recv", step=3), _state(1, 40, 40, now - 70)]
    assert diagnose(pipe, 60, now).message == ("rank 0 waited 61 s in recv #52 of step 3 for "
                                               "rank 1, which never sent")
    # behind in the sequence, inside an earlier collective; or stuck in the same one
    late = [_state(0, 12, 11, now - 90), _state(1, 11, 10, now - 95, kind="broadcast")]
    assert diagnose(late, 60, now).message == ("rank 1 was still in broadcast #11 of step "
                                               "210 while rank 0 waited 90 s in all-reduce #12")
    same = [_state(0, 12, 11, now - 90), _state(1, 12, 11, now - 91, process="stopped")]
    assert diagnose(same, 60, now).message == ("rank 1 entered all-reduce #12 of step 210 but "
                                               "its process, pid 101, is stopped; rank 0 waited "
                                               "90 s")
    every = diagnose([_state(0, 12, 11, now - 90), _state(1, 12, 11, now - 90)], 60, now)
    assert every.behind == () and "the collective itself hangs" in every.message


def test_the_threshold_comes_from_the_flag_or_the_runs_own_steps():
    assert threshold(5.0) == 5.0 and threshold(-1.0) is None
    assert threshold(0.0) == hang.FLOOR_S  # no step seen: the floor
    assert threshold(0.0, [0.1, 0.2]) == hang.FLOOR_S
    assert threshold(0.0, [0.5, 4.0, float("nan")]) == 80.0  # 20 x the slowest step
    assert threshold(0.0, [0.5], [30.0]) == 90.0  # 3 x the slowest evaluation


def test_the_counter_counts_sync_and_async_collectives_once():
    ledger = Ledger([0.0] * Ledger.size(2), 2)
    ledger.join(1, rank=5, pid=4242)
    counter = Counter(ledger, 1)
    counter.step(3)

    class Future:
        def __init__(self):
            self.callbacks = []

        def then(self, fn):
            self.callbacks.append(fn)

    future = Future()
    work = SimpleNamespace(get_future=lambda: future)
    inner = counter.wrap(lambda *a, **k: None, "all-gather")  # an object collective's own call
    sync = counter.wrap(lambda *a, **k: inner(), "broadcast")
    tensor = SimpleNamespace(numel=lambda: 10, element_size=lambda: 4)
    sync(tensor)
    (row,) = ledger.snapshot()
    assert (row.rank, row.pid, row.step, row.entered, row.left, row.kind, row.nbytes) == \
        (5, 4242, 3, 1, 1, "broadcast", 40)  # the inner call was not counted again
    started = counter.wrap(lambda *a, **k: work, "all-reduce")
    started([tensor, tensor], async_op=True)
    (row,) = ledger.snapshot()
    assert (row.entered, row.left, row.inside, row.nbytes) == (2, 1, True, 80)
    # another node's row, copied in from the job's store: never over a local rank's row
    theirs = [1.0] * len(ledger.row(0))
    ledger.put_remote(1, theirs)
    assert ledger.snapshot()[0].pid == 4242 and ledger.snapshot()[0].local
    ledger.put_remote(0, theirs)
    assert [(s.rank, s.local) for s in ledger.snapshot()] == [(1, False), (5, True)]
    ledger.set(0, "pid", 0)  # as before (a row no rank has joined is not shown)
    future.callbacks[0](future)  # the backend completes it
    assert ledger.snapshot()[0].left == 2 and KINDS[int(ledger.get(1, "kind"))] == "all-reduce"
    # gloo's send and receive works give no future: left when the schedule's wait() returns

    def no_future():
        raise RuntimeError("this work has no future")

    waited = []
    recv_work = SimpleNamespace(get_future=no_future, wait=lambda: waited.append(1) or True,
                                is_completed=lambda: False)
    got = counter.wrap(lambda *a, **k: recv_work, "recv")(tensor)
    (row,) = ledger.snapshot()
    assert (row.entered, row.left, row.inside, row.kind) == (3, 2, True, "recv")
    assert got.is_completed() is False  # the work's own, through the wrapper
    assert got.wait() is True and waited == [1]
    assert ledger.snapshot()[0].left == 3
    got.wait()
    assert ledger.snapshot()[0].left == 3  # left once


def test_the_flight_recorder_is_dumped_by_whichever_name_this_torch_has(tmp_path):
    # the boundary, torch._C._distributed_c10d: torch 2.13 has _dump_fr_trace (gloo and NCCL,
    # dumped for real by the SIGSTOP test below); older CUDA builds only _dump_nccl_trace
    older = SimpleNamespace(_dump_nccl_trace=lambda: b"\x80nccl entries")
    assert trace_env(older) == "TORCH_NCCL_TRACE_BUFFER_SIZE"
    path = tmp_path / "ranks" / "fr-trace-3.pkl"
    assert dump_trace(older, path) and path.read_bytes() == b"\x80nccl entries"
    both = SimpleNamespace(_dump_fr_trace=lambda: b"fr", _dump_nccl_trace=lambda: b"nccl")
    assert trace_env(both) == "TORCH_FR_BUFFER_SIZE"
    assert dump_trace(both, path) and path.read_bytes() == b"fr"
    assert trace_env(SimpleNamespace()) == ""
    assert not dump_trace(SimpleNamespace(), tmp_path / "none.pkl")  # a torch without it

    def no_group():
        raise RuntimeError("no process group")

    assert not dump_trace(SimpleNamespace(_dump_fr_trace=no_group), tmp_path / "x.pkl")
    assert not (tmp_path / "none.pkl").exists() and not (tmp_path / "x.pkl").exists()


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout  # a failure guard only
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _first_step_pids(runs: Path) -> tuple[Path, dict[int, int]] | None:
    for run_dir in runs.iterdir():
        try:
            steps = [e for e in read_events(run_dir) if e.kind == "step"]
        except OSError:
            continue
        if steps and steps[-1].per_device:
            return run_dir, {r.rank: r.pid for r in steps[-1].per_device}
    return None


@pytest.mark.slow
def test_a_stopped_rank_is_named_the_run_stops_and_a_watcher_sees_it(tmp_path):
    runs = tmp_path / "runs"
    env = dict(os.environ)  # conftest's private home, cache and runs folder
    run = subprocess.Popen(
        [*GPUTUI, "run", "quickstart", "--strategy", "ddp", "--devices", "cpu*2",
         "--set", "data.train_size=4096", "--set", "data.test_size=256", "--epochs", "50",
         "--set", "run.log_every=2", "--set", "telemetry.enabled=false",
         "--set", "run.threads=1", "--set", "run.checkpoint_every=2", "--stall-after", "5",
         "--runs-dir", str(runs)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    frozen = 0
    try:
        runs.mkdir(exist_ok=True)
        run_dir, pids = _wait_for(lambda: _first_step_pids(runs), 180, "the run's first step")
        watch = subprocess.Popen([*GPUTUI, "watch", run_dir.name, "--runs-dir", str(runs)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)
        frozen = pids[1]
        os.kill(frozen, signal.SIGSTOP)
        out, err = run.communicate(timeout=180)
        w_out, w_err = watch.communicate(timeout=60)
    finally:
        for proc in [run] + ([watch] if "watch" in locals() else []):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        if frozen and psutil.pid_exists(frozen):
            os.kill(frozen, signal.SIGKILL)  # never leave a stopped process behind a failure
    print(out, err, w_out, w_err, sep="\n----\n")  # shown with -s: what the user saw
    assert run.returncode == 1, err
    events = read_events(run_dir)
    (stalled,) = [e for e in events if e.kind == "stalled"]
    assert stalled.behind == (1,) and stalled.threshold_s == 5.0
    # where rank 1 froze is chance: before the collective the others wait in (the usual),
    # inside it, or inside an earlier one; each is named so, with its stopped process
    assert re.fullmatch(rf"rank 1 (never entered|entered|was still in) [a-z-]+ #\d+ of step "
                        rf"\d+ (\(|but )its process, pid {frozen}, is stopped: SIGSTOP or a "
                        rf"debugger\)?(; | while )rank 0 waited \d+ s( in [a-z-]+ #\d+)?",
                        stalled.message), stalled.message
    assert {r["rank"] for r in stalled.ranks} == {0, 1}
    # torch's own flight recorder, from the rank that waited (the stopped one cannot answer)
    import pickle

    import torch._C._distributed_c10d as c10d_c

    if hasattr(c10d_c, "_dump_fr_trace"):
        assert stalled.traces == ("ranks/fr-trace-0.pkl",)
        trace = pickle.loads((run_dir / stalled.traces[0]).read_bytes())
        assert any(e["profiling_name"] == "gloo:all_reduce" for e in trace["entries"])
        assert f"  flight recorder: {stalled.traces[0]}" in out
    end = events[-1]
    assert end.kind == "run_failed" and end.reason.startswith(f"hang: {stalled.message}; "
                                                              f"stopped after 5 s")
    assert end.reason.endswith(f"continue it: gputui resume {run_dir.name}"
                               if (run_dir / "checkpoint.pt").is_file()
                               else "no checkpoint to continue from (run.checkpoint)")
    assert f"hang: {stalled.message}" in out  # on screen, as it happened
    assert not psutil.pid_exists(frozen) and not psutil.pid_exists(pids[0])
    # the other terminal followed it live, read-only, to the same end
    assert watch.returncode == 1, w_err
    assert f"started elsewhere (gputui pid {run.pid})" in w_out
    assert f"hang: {stalled.message}" in w_out and "ended: failed (hang: rank 1" in w_out


def test_another_nodes_row_is_heard_only_when_its_beat_moves():
    """A rank waiting in a collective publishes the same counts every second, with a new
    beat: heard. A frozen rank publishes nothing, and the same text read again is not news."""
    here, there = Ledger([0.0] * Ledger.size(2)), Ledger([0.0] * Ledger.size(2))
    there.join(1, rank=1, pid=77)
    there.beat(1)
    here.put_remote(1, there.row(1))
    first = here.get(1, "heard")
    assert first > 0 and here.snapshot()[0].heard == first and not here.snapshot()[0].local
    time.sleep(0.01)
    here.put_remote(1, there.row(1))  # the store's old text again: no new report
    assert here.get(1, "heard") == first
    there.beat(1)
    here.put_remote(1, there.row(1))
    assert here.get(1, "heard") > first
    assert [s.rank for s in here.unheard(here.snapshot())] == [1, 0]  # rank 0 never reported
