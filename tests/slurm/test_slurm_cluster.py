"""gputui on a real two-node SLURM cluster: Debian's slurmctld, two slurmd in two network
namespaces ("node1" 10.200.0.1, "node2" 10.200.0.2), started by the project's own
scripts/slurm/up.sh for this module and stopped by down.sh. Jobs go in through srun and
sbatch as a user's would; the runs folder (this test's tmp_path) is shared by both nodes, as a
cluster's network file system is. Every SLURM client runs inside node1's namespace (the
wrappers up.sh writes): no 10.200.0.x traffic ever leaves the namespaces.

Skipped, with the reason, where the machine cannot run it: not root, no ip/nsenter/unshare,
or SLURM's packages neither installed nor installable."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from gputui.core.runstore import read_events
from conftest import GPUTUI, ROOT
from procs import tagged

UP, DOWN = ROOT / "scripts" / "slurm" / "up.sh", ROOT / "scripts" / "slurm" / "down.sh"
# a small GPT over two gloo ranks, one per node; epochs enough that a test's stop or kill
# always lands mid-run (a test that lets it finish sets run.epochs itself)
SMALL = ["--strategy", "ddp", "--set", "model.n_layer=2", "--set", "model.n_embd=32",
         "--set", "data.train_size=256", "--set", "data.test_size=64",
         "--set", "optim.warmup_steps=2", "--set", "telemetry.enabled=false",
         "--set", "run.log_every=1", "--set", "strategy.timeout_s=60"]
DAEMONS = ("slurmctld", "slurmd", "slurmscriptd", "slurmstepd")


class Cluster:
    """The cluster up.sh started in ``folder``: its client commands and its namespaces."""

    def __init__(self, folder: Path, tag: str):
        self.folder, self.tag = folder, tag
        self.bin = folder / "cluster" / "bin"
        self.namespaces = [f"gts-{tag}-1", f"gts-{tag}-2"]

    def env(self, runs: Path, test_tag: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.folder / "cluster" / "etc" / "slurm.conf"),
                "GPUTUI_RUNS_DIR": str(runs), "GPUTUI_TEST_TAG": test_tag,
                "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def client(self, *args: str, env: dict[str, str], timeout: float = 60) -> str:
        done = subprocess.run([str(self.bin / args[0]), *args[1:]], env=env, text=True,
                              capture_output=True, timeout=timeout)
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    def logs(self) -> str:
        """The daemons' last log lines, for a failure's message."""
        return "\n".join(f"{p.name}: {line}" for p in sorted((self.folder / "cluster" / "log")
                                                             .glob("slurm*.log"))
                         for line in p.read_text(errors="replace").splitlines()[-15:])

    def leftovers(self) -> list[str]:
        """The processes in the nodes' namespaces other than SLURM's daemons."""
        out = []
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                text = cmd.decode(errors="replace").strip()
                if text and not any(d in text for d in DAEMONS):
                    out.append(f"{ns}: {pid} {text}")
        return out

    def settled(self) -> list[str]:
        """The leftovers once SLURM has finished its own clean-up (a step's slurmstepd ends
        a moment after its tasks; bounded wait)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.leftovers() and not self._steps():
                return []
            time.sleep(0.3)
        return self.leftovers()

    def _steps(self) -> bool:
        for ns in self.namespaces:
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                      text=True).stdout.split():
                try:
                    if b"slurmstepd" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return True
                except OSError:
                    pass
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a SLURM cluster in network namespaces needs root")
    missing = [t for t in ("ip", "nsenter", "unshare") if not shutil.which(t)]
    if missing:
        pytest.skip(f"a SLURM cluster in network namespaces needs {', '.join(missing)}")
    folder = tmp_path_factory.mktemp("slurm")
    tag = f"{os.getpid() % 0xFFFFFF:x}"
    env = {**os.environ, "GPUTUI_SLURM_TAG": tag}
    t0 = time.monotonic()
    up = subprocess.run(["bash", str(UP), str(folder)], env=env, capture_output=True,
                        text=True, timeout=600)
    if up.returncode in (3, 4):  # not root / the packages cannot be installed here
        pytest.skip(f"no SLURM cluster here: {up.stderr.strip().splitlines()[-1:]}")
    if up.returncode:
        subprocess.run(["bash", str(DOWN), str(folder)], capture_output=True, timeout=120)
        if "netns" in up.stderr or "Operation not permitted" in up.stderr:
            pytest.skip(f"this machine does not allow network namespaces: {up.stderr[-300:]}")
        pytest.fail(f"scripts/slurm/up.sh failed:\n{up.stdout}\n{up.stderr}")
    print(f"cluster up in {time.monotonic() - t0:.1f} s")
    yield Cluster(folder, tag)
    t0 = time.monotonic()
    down = subprocess.run(["bash", str(DOWN), str(folder)], capture_output=True, text=True,
                          timeout=120)
    print(f"cluster down in {time.monotonic() - t0:.1f} s")
    assert down.returncode == 0, down.stderr


def _srun(*args: str) -> list[str]:
    return ["srun", "-N2", "--ntasks-per-node=1", *args]


def _runs(runs: Path) -> list[Path]:
    # run folders only: not the nodes' folder, nor a write probe of the moment
    # (filewrite's ".gputui-probe-*" file, there and gone while a node checks the disk)
    return sorted(p for p in runs.iterdir() if p.name != "nodes" and p.is_dir()
                  and not p.name.startswith(".")) if runs.is_dir() else []


def _wait_for(what: str, found, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never saw {what}")


def _stepped(runs: Path) -> Path | None:
    """The first node's run folder once it has recorded a training step."""
    for run in _runs(runs):
        if any(e.kind == "step" for e in read_events(run)):
            return run
    return None


@pytest.mark.slow
def test_a_step_that_does_not_fit_is_refused_before_anything_starts(cluster, tmp_path):
    """--ntasks without --ntasks-per-node (Lightning #20391): 3 tasks on 2 nodes is 2 + 1."""
    env = cluster.env(tmp_path / "runs", uuid.uuid4().hex)
    done = subprocess.run([str(cluster.bin / "srun"), "-N2", "-n3", *GPUTUI, "run", "gpt-tiny",
                           *SMALL], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    line = ("gputui: error: SLURM spread the step's 3 tasks unevenly over its 2 nodes (2,1): "
            "gputui needs the same number on each; ask for --ntasks-per-node=N (1: one gputui "
            "per node, the usual; or the GPUs of a node) instead of --ntasks")
    assert done.stderr.count(line) == 3, done.stderr
    assert "Traceback" not in done.stderr and "exit code 2" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_an_sbatch_job_stopped_by_the_time_limit_signal_requeues_and_resumes(cluster, tmp_path):
    """The script `gputui slurm` writes, submitted as it is: two nodes train into one record;
    SIGUSR1 to the job's steps (what --signal=USR1@120 sends before the time limit) stops the
    run at a checkpoint, the script requeues the job, and the requeued job resumes the run to
    its end. Each step is slowed to at least 100 ms (debug.slow_rank), so the signal always
    lands mid-run however fast the machine."""
    runs, out = tmp_path / "runs", tmp_path / "job-%j.out"
    script = tmp_path / "job.sbatch"
    env = cluster.env(runs, uuid.uuid4().hex)
    sets = [a for a in SMALL if a not in ("--strategy", "ddp")]
    written = subprocess.run([*GPUTUI, "slurm", "gpt-tiny", "--nodes", "2", "--gpus-per-node",
                              "0", "--time", "10", "--job-output", str(out), "--output",
                              str(script), *sets, "--set", "strategy.name=ddp", "--set",
                              "run.epochs=6", "--set", "debug.slow_rank=1", "--set",
                              "debug.slow_backward_ms=100"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    job = cluster.client("sbatch", "--parsable", str(script), env=env).strip()
    first = _wait_for("a recorded step", lambda: _stepped(runs))
    cluster.client("scancel", "--signal=USR1", job, env=env)  # the steps, not the batch shell

    def requeued() -> bool:
        state = cluster.client("scontrol", "show", "job", job, env=env)
        return "Restarts=1" in state and "JobState=PENDING" in state
    _wait_for("the job requeued", requeued)
    _wait_for("both nodes idle", lambda: len(set(cluster.client(
        "sinfo", "-h", "-N", "-t", "idle", "-o", "%N", env=env).split())) == 2)
    # SLURM holds a requeued job about two minutes before it may start again: start it now.
    # Not within the second of the requeue: slurmd refuses a launch whose credential has the
    # second of the kill's revocation ("Job N already killed, do not launch batch job")
    time.sleep(2)
    cluster.client("scontrol", "update", f"JobId={job}", "StartTime=now", env=env)
    _wait_for("the job's end", lambda: "JobState=COMPLETED" in cluster.client(
        "scontrol", "show", "job", job, env=env) or "JobState=FAILED" in cluster.client(
        "scontrol", "show", "job", job, env=env))
    state = cluster.client("scontrol", "show", "job", job, env=env)
    text = Path(str(out).replace("%j", job)).read_text()
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, \
        f"{state}\n{text}\n{cluster.logs()}"
    port = 15000 + int(job) % 10000
    for again in ("", ", requeued 1x"):
        for rank, host in ((0, "node1"), (1, "node2")):
            assert (f"SLURM job {job} step 0{again}: node {rank} of 2 ({host}), rendezvous at "
                    f"node1:{port} (id slurm-{job}.0); one task per node: this node's ranks "
                    f"are its devices") in text, text
    # the first node's records: the run the signal stopped, and its continuation
    stopped, resumed = _runs(runs)
    assert stopped == first and all(f"-slurm{job}-" in r.name for r in (stopped, resumed))
    last = read_events(stopped)[-1]
    usr1 = "stopped by SIGUSR1 (a batch system's time-limit warning)"  # seen here or first on
    assert last.kind == "run_stopped" and last.reason in (usr1, f"{usr1} (on another rank)")
    events = read_events(resumed)
    assert events[-1].kind == "run_finished", text
    assert any(e.kind == "log" and f"resumed from {stopped.resolve()}" in e.message
               for e in events)
    assert json.loads((resumed / "summary.json").read_text())["status"] == "finished"
    # the second node's records, beside them
    assert len(list((runs / "nodes" / "node1").iterdir())) == 2
    assert "Traceback" not in text
    assert cluster.settled() == [] and tagged(env["GPUTUI_TEST_TAG"]) == []


@pytest.mark.slow
def test_scancel_leaves_a_resumable_record_and_no_process_on_either_node(cluster, tmp_path):
    from gputui.cli.resume import register, resume_args

    runs, name = tmp_path / "runs", f"gputui-{uuid.uuid4().hex[:8]}"
    env = cluster.env(runs, uuid.uuid4().hex)
    srun = subprocess.Popen([str(cluster.bin / "srun"), *_srun("-J", name)[1:], *GPUTUI, "run",
                             "gpt-tiny", *SMALL, "--set", "run.epochs=500"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    try:
        run = _wait_for("a recorded step", lambda: _stepped(runs))
        cluster.client("scancel", "--name", name, env=env)
        out, _ = srun.communicate(timeout=120)
    finally:
        srun.kill()
    last = read_events(run)[-1]
    # SLURM signals each node's processes at its own moment: the other node's rank can be the
    # first to see it, and the agreement brings its reason
    assert last.kind == "run_stopped" and last.reason in (
        "stopped by SIGTERM", "stopped by SIGTERM (on another rank)"), out
    assert (run / "checkpoint.pt").is_file()
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    assert f"(continue it: srun gputui resume {run.name})" in out, out
    assert "Traceback" not in out
    # resumable: `gputui resume` accepts it (the run's config, from its checkpoint)
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = resume_args(parser.parse_args(["resume", run.name, "--runs-dir", str(runs)]))
    assert args.resume_from == str(run.resolve())
    assert cluster.settled() == [] and tagged(env["GPUTUI_TEST_TAG"]) == []


@pytest.mark.slow
def test_a_node_killed_mid_run_is_named_with_the_command_that_resumes_it(cluster, tmp_path):
    """Node 2's gputui (every process of it) is SIGKILLed once the first checkpoint is
    written: the first node's record names the node, the checkpoint and the command that
    resumes it (`srun gputui resume`, which the sbatch test runs), and nothing is left."""
    runs = tmp_path / "runs"
    env = cluster.env(runs, uuid.uuid4().hex)
    srun = subprocess.Popen([str(cluster.bin / "srun"), *_srun()[1:], *GPUTUI, "run",
                             "gpt-tiny", *SMALL, "--set", "run.epochs=500",
                             "--set", "run.checkpoint_every=2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    try:
        run = _wait_for("the first checkpoint", lambda: next(
            (r for r in _runs(runs) if (r / "checkpoint.pt").is_file()), None))
        mark = f"GPUTUI_TEST_TAG={env['GPUTUI_TEST_TAG']}".encode()

        def kill_node2() -> int:
            killed = 0
            for pid in subprocess.run(["ip", "netns", "pids", cluster.namespaces[1]],
                                      capture_output=True, text=True).stdout.split():
                try:  # the job's processes on node 2 (this test's tag), not SLURM's
                    if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                        os.kill(int(pid), 9)
                        killed += 1
                except OSError:
                    pass
            return killed
        # the whole node at once, as a machine that dies: again until a pass finds none (one
        # pass can miss a process started while it read the list: suspected, not shown, in
        # the one failure seen in 8 runs, where rank 0 waited for gloo's 60 s timeout instead
        # of seeing node 2's connection close)
        deadline = time.monotonic() + 30
        while kill_node2() and time.monotonic() < deadline:
            time.sleep(0.05)
        out, _ = srun.communicate(timeout=180)
    finally:
        srun.kill()
    last = read_events(run)[-1]
    assert last.kind == "run_failed", out
    command = f"srun gputui resume {run.name}"
    assert re.match(rf"node 1 \(10\.200\.0\.2\) went away at epoch \d+ after step \d+; the "
                    rf"last checkpoint is {re.escape(str(run / 'checkpoint.pt'))} \(.+\); "
                    rf"resume it with `{re.escape(command)}` on 2 nodes", last.reason), \
        last.reason
    assert cluster.settled() == [] and tagged(env["GPUTUI_TEST_TAG"]) == []


def _fork_server(pid: str) -> bool:
    """Whether ``pid`` is a fork server or forked by one (its name or command line): the
    host forked (gputui.train.agent.SERVER_NAME) or multiprocessing's spawned server."""
    from gputui.train.agent import SERVER_NAME

    return Path(f"/proc/{pid}/comm").read_text().strip() == SERVER_NAME or \
        b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()


def _rank_on(namespace: str, tag: str) -> int | None:
    """The training rank of this test's job on a node: the fork server's child."""
    mark = f"GPUTUI_TEST_TAG={tag}".encode()
    for pid in subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                              text=True).stdout.split():
        try:
            if mark not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            if _fork_server(parent):
                return int(pid)
        except OSError:
            continue
    return None


@pytest.mark.slow
def test_a_rank_stopped_on_the_second_node_is_named_and_the_job_stops(cluster, tmp_path):
    """Node 2's rank is frozen (SIGSTOP) once the job has a checkpoint: within the
    threshold a node's record names rank 1 (and none names rank 0, which only waited), the
    job stops with its resume command instead of waiting for gloo's timeout, and neither
    node keeps a process (the frozen one included)."""
    runs = tmp_path / "runs"
    env = cluster.env(runs, uuid.uuid4().hex)
    srun = subprocess.Popen([str(cluster.bin / "srun"), *_srun()[1:], *GPUTUI, "run",
                             "gpt-tiny", *SMALL, "--set", "run.epochs=500",
                             "--set", "run.checkpoint_every=2", "--stall-after", "5"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    frozen = None
    try:
        # frozen once there is a checkpoint to resume from (before it, the run says "no
        # checkpoint was written yet: submit the job again", as a fresh clone's suite saw)
        run = _wait_for("the first checkpoint", lambda: next(
            (r for r in _runs(runs) if (r / "checkpoint.pt").is_file()), None))
        frozen = _wait_for("node 2's rank", lambda: _rank_on(cluster.namespaces[1],
                                                             env["GPUTUI_TEST_TAG"]))
        os.kill(frozen, 19)  # SIGSTOP
        out, _ = srun.communicate(timeout=240)
    finally:
        srun.kill()
        if frozen:
            try:
                os.kill(frozen, 9)  # never leave a stopped process behind a failure
            except OSError:
                pass
    print(out)  # with -s: what the user saw
    # whichever node's watch sees it first names it: node 2 by its stopped process, or the
    # first node by rank 1's silence (frozen, its reports froze too); the other node's run
    # then ends on the hang, or on node 2 going away, each with the command that resumes it
    records = _runs(runs) + sorted((runs / "nodes").glob("node*/*"))
    stalled = [e for r in records for e in read_events(r) if e.kind == "stalled"]
    assert stalled, out
    for e in stalled:
        assert e.behind == (1,) and e.threshold_s == 5.0, e
        assert re.fullmatch(
            r"rank 1 stopped in step \d+ \(its process, pid \d+, is stopped: SIGSTOP or a "
            r"debugger\)|rank 1 (entered|never entered|was still in) .*its process, pid \d+, "
            r"is stopped.*|rank 1 on another node (went silent \d+ s ago \(last heard of in "
            r"step \d+\)|never reported to this node): its process stopped, died or lost this "
            r"node( before its first report)?; rank 0 waited \d+ s in [a-z-]+ #\d+ of step "
            r"\d+", e.message), e.message
        assert f"hang: {e.message}" in out
    end = read_events(run)[-1]
    assert end.kind == "run_failed", end
    assert end.reason.startswith("hang: rank 1") or re.match(
        r"node 1 \(10\.200\.0\.2\) went away", end.reason), end.reason
    assert f"gputui resume {run.name}" in end.reason, end.reason
    assert "Traceback" not in out
    assert cluster.settled() == [] and tagged(env["GPUTUI_TEST_TAG"]) == []
