"""The stop contract (docs/failures.md), for every command that trains or measures: SIGINT or
SIGTERM, wherever it lands, stops cleanly: every record it leaves is readable and closed
(the run in flight ``stopped``), partial results are printed, the exit status is 128 + the
signal with one last line saying what was kept, and no process is left (nor a traceback or
the leaked-semaphore warning). Real processes, real signals to the process group (or to the
command's pid alone); tiny presets.

Moments: "first" signals right after Popen (the interpreter's start-up, the command line's
imports: wherever it lands, the contract's outcome is accepted); the others wait for a line
the command prints (a readiness marker), so no test depends on timing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from procs import tagged

from gputui.core.signals import describe

GPUTUI = [sys.executable, "-m", "gputui"]
TINY = ["--set", "data.train_size=512", "--set", "data.test_size=64",
        "--set", "telemetry.enabled=false"]


def _sigint_as_a_terminal_has_it() -> None:
    """The command's SIGINT at its default, as a terminal's foreground command starts, whatever
    this test runner inherited: a runner started as a non-interactive shell's background job
    (`pytest ... &` in a script) ignores SIGINT, its children inherit that until they set a
    handler, and the "first" cases' signal, sent during the interpreter's start-up, was then
    discarded before anything could see it (the run trained to its end and exited 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command:
    """One command in a session of its own, its output read as it comes."""

    def __init__(self, tmp: Path, args: list[str]):
        self.tag = uuid.uuid4().hex
        env = dict(os.environ, GPUTUI_TEST_TAG=self.tag, GPUTUI_CACHE_DIR=str(tmp / "cache"),
                   GPUTUI_RUNS_DIR=str(tmp / "runs"), OMP_WAIT_POLICY="PASSIVE")
        self.proc = subprocess.Popen([*GPUTUI, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                     start_new_session=True, env=env,
                                     preexec_fn=_sigint_as_a_terminal_has_it)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("")  # the end of the output
            self._cond.notify_all()

    def wait_for(self, marker: str, timeout: float = 240) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(marker in t for t in self.lines)
                                     or self.proc.poll() is not None, timeout)
        assert ok and any(marker in t for t in self.lines), \
            (marker, self.proc.poll(), self.lines[-20:])

    def finish(self, timeout: float = 240) -> str:
        self.proc.wait(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self.lines[-1:] == [""], 10)
            return "\n".join(self.lines)


def check_contract(cmd: Command, sig: int, tmp: Path) -> list[dict]:
    """The contract's outcome; returns the summaries of the records left."""
    out = cmd.finish()
    code = cmd.proc.returncode
    runs = tmp / "runs"
    folders = sorted(p for p in runs.rglob("config.toml")) if runs.exists() else []
    assert [p.pid for p in tagged(cmd.tag)] == [], out[-2000:]
    # Before the interpreter has run gputui's first line (its own start-up: its standard
    # streams, the site module), nothing of gputui's can take a signal: the process ends as
    # the signal's default does (a shell sees 128 + sig), or, for SIGINT during that start-up,
    # with Python's own "Fatal Python error: init_sys_streams" (or init_import_site, ...) and
    # a KeyboardInterrupt. Nothing was started or recorded.
    in_startup = re.search(r"^Fatal Python error: init_\w+", out, re.MULTILINE)
    if code == -sig or (sig == signal.SIGINT and in_startup and "KeyboardInterrupt" in out):
        assert folders == [], out
        return []
    assert "Traceback" not in out and "leaked semaphore" not in out, out[-3000:]
    assert code == 128 + sig, out[-3000:]
    last = [t for t in out.splitlines() if t.strip()][-1]
    assert last.startswith(f"gputui: stopped by {describe(sig)}"), out[-3000:]
    summaries = []
    for cfg in folders:
        summary = json.loads((cfg.parent / "summary.json").read_text())  # readable, closed
        assert summary["status"] in ("finished", "stopped", "killed"), summary
        summaries.append(summary)
    return summaries


def _send(cmd: Command, sig: int, group: bool = True) -> None:
    if group:
        os.killpg(cmd.proc.pid, sig)
    else:
        os.kill(cmd.proc.pid, sig)


# (command line, where the signal goes: None = right after Popen, else the line waited for,
#  the signal, to the group or to the pid alone)
CASES = {
    "run-first": (["run", "quickstart", "--strategy", "ddp", "--devices", "cpu*2", *TINY],
                  None, signal.SIGINT, True),
    "run-started": (["run", "quickstart", "--strategy", "ddp", "--devices", "cpu*2",
                     "--epochs", "50", *TINY], "strategy ddp", signal.SIGINT, True),
    "run-started-pid": (["run", "quickstart", "--strategy", "single", "--devices", "cpu",
                         "--epochs", "50", *TINY], "strategy single", signal.SIGTERM, False),
    "sweep-first": (["sweep", "quickstart", "--devices", "cpu", "--strategies", "single",
                     "--epochs", "1", *TINY], None, signal.SIGTERM, True),
    "sweep-started": (["sweep", "quickstart", "--devices", "cpu,cpu*2", "--strategies",
                       "single,scratch", "--epochs", "50", *TINY], "[1/4] single on cpu",
                      signal.SIGINT, True),
    "verify-first": (["verify", "quickstart", "--devices", "cpu*2", "--strategies", "ddp",
                      "--steps", "2", *TINY], None, signal.SIGTERM, True),
    "verify-between": (["verify", "quickstart", "--devices", "cpu*2", "--strategies",
                        "scratch,ddp", "--steps", "2", *TINY], "verify: scratch on",
                       signal.SIGTERM, True),
    "tune-first": (["tune", "quickstart", "--devices", "cpu*2", "--strategies", "ddp",
                    "--micro-batches", "1", "--batch-per-device", "64", "--top", "1",
                    "--steps", "20", "-o", "tuned.toml", *TINY], None, signal.SIGINT, True),
    "tune-measuring-pid": (["tune", "quickstart", "--devices", "cpu*2", "--strategies", "ddp",
                            "--micro-batches", "1", "--batch-per-device", "64", "--top", "1",
                            "--steps", "20", "-o", "tuned.toml", *TINY],
                           "measuring the prediction's inputs", signal.SIGINT, False),
    "predict-measuring": (["predict", "quickstart", "--devices", "1,2", "--kind", "cpu",
                           "--strategies", "ddp", *TINY], "predicting", signal.SIGTERM, True),
    # gpt-tiny's meshes traced, then their collectives measured in their steps on 2 gloo
    # ranks (a driver and its elastic ranks, killed at once by the stop)
    "plan-measuring": (["plan", "gpt-tiny", "--gpus", "cpu*2"], "measuring gloo's collectives",
                       signal.SIGTERM, True),
    "bench-comm-first": (["bench-comm", "--devices", "cpu*2", "--sizes", "4K", "--iters", "2",
                          "--repeats", "1", "--impl", "torch"], None, signal.SIGTERM, True),
    "bench-comm-timing": (["bench-comm", "--devices", "cpu*2", "--sizes", "4K", "--iters", "2",
                           "--repeats", "1", "--impl", "torch"], "bench-comm: timing",
                          signal.SIGINT, True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_stop_signal_keeps_the_contract(tmp_path, case):
    args, marker, sig, group = CASES[case]
    cmd = Command(tmp_path, args)
    if marker is not None:
        cmd.wait_for(marker)
    _send(cmd, sig, group)
    summaries = check_contract(cmd, sig, tmp_path)
    if marker is not None and args[0] in ("run", "sweep"):  # the run in flight: stopped
        assert summaries and summaries[-1]["status"] in ("stopped", "finished"), summaries
    if args[0] == "tune":  # interrupted: no preset (its docs)
        assert not (tmp_path / "tuned.toml").exists()
    if case == "verify-between":  # no FAIL for the stopped strategy, and no next one
        out = "\n".join(cmd.lines)
        assert "FAIL" not in out and "verify: ddp on" not in out, out


# A Ctrl-C that lands after the command line loaded and before the run's Supervisor existed
# was lost when the spawner ignores SIGINT (a shell's background job: the run trained to its
# end and exited 0). Sent here by the command itself at the moment the launcher is imported
# (inside `run`, after the preset is resolved), so no timing is involved.
AT_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a non-interactive shell's `gputui run &`
import __main__
__main__.__file__ = os.path.join(os.path.dirname(sys.executable), "gputui")  # the script

class At:
    def find_spec(self, name, path=None, target=None):
        if name == sys.argv[1]:
            os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, At())
from gputui.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("module", ["gputui.cli.common", "gputui.runs.launcher"])
def test_ctrl_c_before_the_run_starts_is_never_lost(tmp_path, module):
    tag = uuid.uuid4().hex
    done = subprocess.run(
        [sys.executable, "-c", AT_IMPORT, module, "run", "quickstart", "--strategy", "single",
         "--devices", "cpu", "--runs-dir", str(tmp_path / "runs"), *TINY],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, GPUTUI_TEST_TAG=tag))
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("gputui: stopped by SIGINT (Ctrl-C) "
                                                           "before"), done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert [p.pid for p in tagged(tag)] == []


@pytest.mark.slow
def test_resume_keeps_the_contract(tmp_path):
    """`gputui resume` of a stopped run, stopped once it has started in its turn."""
    run = Command(tmp_path, ["run", "quickstart", "--strategy", "single", "--devices", "cpu",
                             "--epochs", "50", *TINY])
    run.wait_for("epoch 1")
    _send(run, signal.SIGINT)
    check_contract(run, signal.SIGINT, tmp_path)
    stopped = next((tmp_path / "runs").iterdir()).name
    again = Command(tmp_path, ["resume", stopped])
    again.wait_for("strategy single")
    _send(again, signal.SIGTERM)
    summaries = check_contract(again, signal.SIGTERM, tmp_path)
    assert len(summaries) == 2 and summaries[-1]["status"] in ("stopped", "finished")


LEAKS_ONE = """
import multiprocessing as mp, os, sys
from pathlib import Path
from gputui.runs.forecast.tracing import TraceCache, Tracer

if __name__ == "__main__":  # not in the tracing child, which imports this file (spawn)
    got = Tracer(lambda text: None, cache=TraceCache(Path(sys.argv[1]))).run(
        [{"kind": "trace", "spec": {}, "label": "a mesh that does not trace"}])
    assert all("error" in g for g in got.values()), got
    lock = mp.get_context("spawn").Lock()  # a semaphore never unlinked, as a killed child's
    os._exit(0)
"""


def test_a_plans_resource_tracker_is_quiet_about_what_a_stop_leaves(tmp_path):
    """A plan's first semaphores (its tracing children's queue) start the resource tracker:
    gputui's own, which unlinks what a killed child registered without the "leaked
    semaphore objects" warning after the stop's last line (a plan on cpu*3 stopped while
    measuring printed it: the queue had started a plain tracker first)."""
    script = tmp_path / "leaks_one.py"
    script.write_text(LEAKS_ONE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "leaked semaphore" not in done.stderr and "Traceback" not in done.stderr, done.stderr


TRACKER_MASK = """
import signal
from multiprocessing import resource_tracker
from gputui.core.proctree import own_tracker

own_tracker()
pid = resource_tracker._resource_tracker._pid
status = open(f"/proc/{pid}/status").read()
mask = int(next(ln for ln in status.splitlines() if ln.startswith("SigBlk")).split()[1], 16)
print(all(mask >> (s - 1) & 1 for s in (signal.SIGHUP, signal.SIGUSR1)),
      signal.pthread_sigmask(signal.SIG_BLOCK, []) == set())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_the_resource_tracker_is_deaf_to_hang_ups_and_slurms_usr1_and_gputui_is_not():
    """gputui's resource tracker starts with SIGHUP and SIGUSR1 blocked, for good (a hang-up
    or SLURM's --signal=USR1 to the whole group would end it, and a semaphore's clean-up at
    exit would start another that outlives gputui); gputui's own mask is as it was after,
    so a hang-up that came meanwhile is its handler's, not lost as an ignored one was."""
    done = subprocess.run([sys.executable, "-c", TRACKER_MASK], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr


def _as_nohup_starts_it() -> None:
    """`nohup gputui run ... &`: SIGHUP ignored from the start (SIGINT at its default)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_a_run_started_under_nohup_outlives_the_hang_up(tmp_path):
    """A hang-up to the whole group of a run started with SIGHUP ignored (nohup) is ignored
    by gputui and its ranks alike; the SIGTERM after it is the stop the record names (had
    any of them taken the hang-up, the stop would be SIGHUP's, the first). Ranks: ddp on
    two CPU devices, each rank a process of its own."""
    tag = uuid.uuid4().hex
    env = dict(os.environ, GPUTUI_TEST_TAG=tag, GPUTUI_CACHE_DIR=str(tmp_path / "cache"),
               GPUTUI_RUNS_DIR=str(tmp_path / "runs"), OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.Popen([*GPUTUI, "run", "quickstart", "--strategy", "ddp", "--devices",
                             "cpu*2", "--epochs", "50", *TINY], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            start_new_session=True, env=env, preexec_fn=_as_nohup_starts_it)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the ranks are training once the first step is logged
            lines.append(line)
            if line.startswith("epoch 1") or "step " in line:
                break
        os.killpg(proc.pid, signal.SIGHUP)
        os.killpg(proc.pid, signal.SIGTERM)
        out = "".join(lines) + proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert out.strip().splitlines()[-1].startswith("gputui: stopped by SIGTERM"), out[-3000:]
    summary = json.loads(next((tmp_path / "runs").rglob("summary.json")).read_text())
    assert summary["status"] in ("stopped", "finished"), summary
    if summary["status"] == "stopped":
        assert "SIGTERM" in summary["reason"] and "SIGHUP" not in summary["reason"], summary
    assert [p.pid for p in tagged(tag)] == []
