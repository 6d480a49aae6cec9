"""ddp as users run it, in real processes: `gputui run --strategy ddp` end to end, two "nodes"
on localhost training as one job, a rank killed mid-run, a stop the ranks agree on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputui.core.config import RunConfig, apply_overrides
from gputui.core.runstore import read_events, read_summary
from gputui.runs.launcher import launch
from gputui.core.handoff import data_file
from gputui.train.agent import free_port

GPUTUI = [sys.executable, "-m", "gputui"]
SMALL = ["--set", "data.train_size=2048", "--set", "data.test_size=512", "--epochs", "1"]
pytestmark = pytest.mark.slow


def _steps(run_dir) -> list:
    return [e for e in read_events(run_dir) if e.kind == "step"]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    proc = subprocess.run([*GPUTUI, "run", "quickstart", "--strategy", "ddp", *SMALL,
                           "--set", "run.log_every=4", "--set", "telemetry.interval_s=0.25",
                           "--runs-dir", str(runs), "--json"],
                          capture_output=True, text=True, timeout=240,
                          env={k: v for k, v in os.environ.items() if k != "GPUTUI_FORKSERVER"})
    return proc


def test_the_ranks_fork_server_is_the_host_forked_or_multiprocessings_and_trains_alike(
        cli_run, tmp_path):
    """On CPU devices the ranks' fork server is the host forked (its imports inherited);
    GPUTUI_FORKSERVER=spawn (and every GPU run) takes multiprocessing's spawned one: the same
    run trains the same either way, and each says which in the record's ranks/agent.log."""
    assert cli_run.returncode == 0, cli_run.stderr
    forked = json.loads(cli_run.stdout)
    log = (Path(forked["run_dir"]) / "ranks" / "agent.log").read_text()
    assert re.search(r"^fork server: pid \d+, forked from this host", log, re.M), log
    assert "had ended" not in log  # the ranks came from it (no spawned server replaced it)
    proc = subprocess.run([*GPUTUI, "run", "quickstart", "--strategy", "ddp", *SMALL,
                           "--set", "run.log_every=4", "--set", "telemetry.interval_s=0.25",
                           "--runs-dir", str(tmp_path), "--json"], capture_output=True,
                          text=True, timeout=240, env=dict(os.environ, GPUTUI_FORKSERVER="spawn"))
    assert proc.returncode == 0, proc.stderr
    spawned = json.loads(proc.stdout)
    log = (Path(spawned["run_dir"]) / "ranks" / "agent.log").read_text()
    assert re.search(r"^fork server: pid \d+, multiprocessing's, spawned", log, re.M), log
    assert [s.loss for s in _steps(spawned["run_dir"])] == \
        [s.loss for s in _steps(forked["run_dir"])]
    assert spawned["test_acc"] == forked["test_acc"]


def test_cli_ddp_run_finishes_with_every_rank_in_the_record(cli_run):
    assert cli_run.returncode == 0, cli_run.stderr
    summary = json.loads(cli_run.stdout)
    assert summary["status"] == "finished" and summary["strategy"] == "ddp"
    assert summary["world_size"] == 2 and summary["devices"] == ["cpu:0", "cpu:1"]
    run_dir = summary["run_dir"]
    steps = _steps(run_dir)
    assert [s.step for s in steps] == [4, 8]
    # the gradient sync, timed by DDP's comm hook on the metered steps: a real share of the step
    assert all(s.comm_share is not None and 0 < s.comm_share < 1 for s in steps), steps
    rows = steps[-1].per_device
    assert [r.device for r in rows] == ["cpu:0", "cpu:1"] and [r.rank for r in rows] == [0, 1]
    assert all(r.samples == 128 and r.step_time_s > 0 and r.samples_per_s > 0
               and r.rss > 10 * 2**20 for r in rows)
    # where each rank's metered step went, recorded and printed per rank
    from gputui.core.breakdown import total

    for s in steps:
        assert s.breakdown is not None and s.breakdown.comm_exposed_s is not None
        for r in s.per_device:
            assert total(r.breakdown) == pytest.approx(r.breakdown.step_s)
    assert re.search(r"cpu:1 step [\d.]+ ms: compute \d+% · comm \d+%", cli_run.stderr)
    pids = {r.device: r.pid for r in rows}
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    # the sampler read each rank's own process (RunHandle.pids from the ranks)
    samples = read_events(run_dir, "telemetry.jsonl")
    sampled = {(s.device, s.pid) for s in samples if s.pid}
    assert {("cpu:0", pids["cpu:0"]), ("cpu:1", pids["cpu:1"])} <= sampled
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // 2)  # each rank its share of this machine's cores
    assert f"2 gloo ranks on the CPU, {threads} thread(s) each" in cli_run.stderr
    assert "Traceback" not in cli_run.stderr  # rank and agent logs stay in the record
    assert os.path.isdir(os.path.join(run_dir, "ranks"))
    assert not data_file(summary["run_id"]).exists()  # the node's dataset copy


def test_two_nodes_on_localhost_train_as_one_job(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen(
        [*GPUTUI, "run", "quickstart", "--strategy", "ddp", "--devices", "cpu", *SMALL,
         "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", endpoint,
         "--set", "run.threads=1", "--set", "telemetry.enabled=false",
         "--runs-dir", str(tmp_path / f"node{r}"), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    summaries = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert f"waiting for 2 nodes at {endpoint}" in err
        summaries.append(json.loads(out))
    assert [s["world_size"] for s in summaries] == [2, 2]
    assert [s["devices"] for s in summaries] == [["cpu:0"], ["cpu:0"]]
    losses = [[e.loss for e in _steps(s["run_dir"])] for s in summaries]
    assert len(losses[0]) == 1 and losses[0] == losses[1]  # one job: the same reduced loss
    assert summaries[0]["test_acc"] == summaries[1]["test_acc"]
    rows = _steps(summaries[0]["run_dir"])[-1].per_device
    assert sorted(r.rank for r in rows) == [0, 1]
    assert sum("@node" in r.device for r in rows) == 1  # the other machine's rank, named


def _ddp_config(**changes) -> RunConfig:
    base = {"strategy.name": "ddp", "devices.spec": "cpu*2", "data.train_size": 2048,
            "data.test_size": 256, "run.epochs": 50, "run.log_every": 2,
            "model.init": "default", "telemetry.enabled": False, "run.checkpoint": False}
    base.update(changes)
    return apply_overrides(RunConfig(), [("test", k, v) for k, v in base.items()])


def _until_step(handle, timeout=120) -> list:
    seen, deadline = [], time.monotonic() + timeout
    while not any(e.kind == "step" for e in seen) and time.monotonic() < deadline:
        seen += handle.poll(timeout=0.2)
    assert any(e.kind == "step" for e in seen), seen
    return seen


def _gone(pids) -> bool:
    """No process of ``pids`` exists, not even as a zombie."""
    return not any(psutil.pid_exists(p) for p in pids)


def test_a_killed_rank_fails_the_run_with_the_reason_and_leaves_no_process(tmp_path):
    handle = launch(_ddp_config(), tmp_path)
    _until_step(handle)
    agent = handle.host.process.pid
    tree = [agent] + [p.pid for p in psutil.Process(agent).children(recursive=True)]
    victim = handle.pids()["cpu:1"]
    assert victim in tree and handle.pids()["cpu:0"] in tree
    os.kill(victim, signal.SIGKILL)
    assert handle.wait(timeout=60) == "failed"
    events = read_events(handle.run_dir)
    assert events[-1].kind == "run_failed"
    assert re.fullmatch(rf"rank 1 \(pid {victim}\) was killed by SIGKILL", events[-1].reason)
    assert read_summary(handle.run_dir).reason == events[-1].reason
    # gone when the run is over, not a moment later: fork server, resource tracker, ranks
    assert _gone(tree), [psutil.Process(p) for p in tree if psutil.pid_exists(p)]
    assert not data_file(handle.run_id).exists()


def test_a_hung_rank_cannot_hang_the_run(tmp_path):
    """Rank 1 frozen (SIGSTOP) mid-run: rank 0 waits in a collective until strategy.timeout_s,
    then the run fails with a clear reason and every process, the frozen one too, is gone."""
    handle = launch(_ddp_config(**{"strategy.timeout_s": 4.0}), tmp_path)
    _until_step(handle)
    agent = handle.host.process.pid
    tree = [agent] + [p.pid for p in psutil.Process(agent).children(recursive=True)]
    frozen = handle.pids()["cpu:1"]
    os.kill(frozen, signal.SIGSTOP)
    started = time.monotonic()
    try:
        assert handle.wait(timeout=90) == "failed"
    finally:
        if psutil.pid_exists(frozen):
            os.kill(frozen, signal.SIGKILL)  # never leave a stopped process behind a failure
    waited = time.monotonic() - started
    events = read_events(handle.run_dir)
    assert events[-1].kind == "run_failed"
    assert re.fullmatch(r"rank \d: a collective timed out after 4 s \(strategy.timeout_s\): "
                        r"another rank stopped responding; raise strategy.timeout_s if the "
                        r"ranks are only slow", events[-1].reason), events[-1].reason
    # 4 s of timeout, then the agent gives the other ranks SHUTDOWN_TIMEOUT_S (5 s) before
    # SIGKILL, which is what ends a frozen process (torch's own wait is 30 s: 34 s or more)
    assert waited < 30, f"the run took {waited:.0f} s to end after a rank hung (timeout 4 s)"
    deadline = time.monotonic() + 15
    while not _gone(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(tree), [p for p in tree if psutil.pid_exists(p)]


def test_a_stop_is_agreed_by_every_rank(tmp_path):
    handle = launch(_ddp_config(), tmp_path)
    _until_step(handle)
    ranks = list(handle.pids().values())
    handle.stop()
    assert handle.wait(timeout=60) == "stopped"
    events = read_events(handle.run_dir)
    assert events[-1].kind == "run_stopped" and events[-1].reason == "stopped by user"
    assert not any(e.kind == "run_failed" for e in events)
    handle.host.process.join(timeout=10)
    assert handle.host.process.exitcode == 0
    assert _gone(ranks)


def test_a_stop_while_waiting_for_other_nodes_ends_the_run(tmp_path):
    cfg = _ddp_config(**{"devices.spec": "cpu", "dist.nnodes": 2,
                         "dist.rdzv_endpoint": f"127.0.0.1:{free_port()}"})
    handle = launch(cfg, tmp_path)
    seen, deadline = [], time.monotonic() + 60
    while not any(e.kind == "log" for e in seen) and time.monotonic() < deadline:
        seen += handle.poll(timeout=0.2)
    assert seen[0].message.startswith("waiting for 2 nodes at 127.0.0.1:")
    tree = [handle.host.process.pid] + [
        p.pid for p in psutil.Process(handle.host.process.pid).children(recursive=True)]
    handle.stop()
    assert handle.wait(timeout=30) == "stopped"
    assert read_events(handle.run_dir)[-1].reason == "stopped by user before the ranks started"
    time.sleep(1)
    assert _gone(tree)
