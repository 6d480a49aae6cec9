"""Multi-node faults for real: two "machines" as network namespaces on this one, each with
its own address (a veth pair between them) and its own host name (``unshare --uts``), resolved
through ``/etc/netns/NS/hosts`` (DESIGN.md's practical notes). Node 0's host name resolves to a
loopback address, as on many fresh machines and containers. Skipped, with the reason, where
this machine does not let a test make namespaces (not root, no ``ip``/``unshare``)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputui.core.runstore import read_events

PRESET = "lenet-ddp-2nodes"


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


class Machines:
    """Two namespaces joined by a veth pair; ``command(r, args)`` runs gputui on node r."""

    def __init__(self, tag: str, subnet: int):
        self.ns = [f"gputui-{tag}-{r}" for r in (0, 1)]
        self.veth = [f"gt{tag[-6:]}{r}" for r in (0, 1)]
        self.addr = [f"10.77.{subnet}.{r + 1}" for r in (0, 1)]
        self.name = [f"gputui-node{r}" for r in (0, 1)]

    def up(self) -> None:
        for ns in self.ns:
            self._ok("ip", "netns", "add", ns)
        self._ok("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for r, ns in enumerate(self.ns):
            self._ok("ip", "link", "set", self.veth[r], "netns", ns)
            self._ok("ip", "-n", ns, "addr", "add", f"{self.addr[r]}/24", "dev", self.veth[r])
            self._ok("ip", "-n", ns, "link", "set", self.veth[r], "up")
            self._ok("ip", "-n", ns, "link", "set", "lo", "up")
            folder = Path("/etc/netns") / ns
            folder.mkdir(parents=True, exist_ok=True)
            # node 0's own name on loopback (127.0.1.1), as Debian's installer writes it
            own = ["127.0.1.1", self.addr[1]][r]
            (folder / "hosts").write_text(
                f"127.0.0.1 localhost\n{own} {self.name[r]}\n"
                f"{self.addr[1 - r]} {self.name[1 - r]}\n")

    def down(self) -> None:
        for ns in self.ns:
            for pid in self.pids(ns):
                _sh("kill", "-9", pid)
            _sh("ip", "netns", "del", ns)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)

    @staticmethod
    def pids(ns: str) -> list[str]:
        return _sh("ip", "netns", "pids", ns).stdout.split()

    @staticmethod
    def _ok(*args: str) -> None:
        done = _sh(*args)
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")

    def command(self, r: int, args: list[str]) -> list[str]:
        run = " ".join([sys.executable, "-m", "gputui", *args])
        return ["ip", "netns", "exec", self.ns[r], "unshare", "--uts", "sh", "-c",
                f"hostname {self.name[r]} && exec {run}"]


@pytest.fixture
def machines():
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("unshare")):
        pytest.skip("two network namespaces need root, ip(8) and unshare(1)")
    m = Machines(f"{os.getpid() % 100000}{random.randrange(1000)}", random.randrange(1, 250))
    try:
        m.up()
    except (RuntimeError, OSError) as exc:
        m.down()
        pytest.skip(f"this machine does not allow network namespaces here ({exc})")
    yield m
    m.down()


def _args(m: Machines, r: int, runs: Path, *extra: str) -> list[str]:
    return ["run", PRESET, "--node-rank", str(r), "--rdzv-endpoint", f"{m.addr[0]}:29400",
            "--runs-dir", str(runs / f"node{r}"), "--set", "telemetry.enabled=false", *extra]


@pytest.mark.slow
def test_a_host_name_on_loopback_is_refused_before_the_rendezvous(machines, tmp_path):
    done = subprocess.run(machines.command(0, _args(machines, 0, tmp_path)),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"gputui: error: dist.nnodes = 2: this machine's host name 'gputui-node0' resolves to "
        f"127.0.1.1, a loopback address: the other nodes would connect to themselves there, "
        f"not to this machine, and wait until the rendezvous times out; set dist.interface to "
        f"the network interface that reaches them (--set dist.interface=NAME) (here: "
        f"{machines.veth[0]} {machines.addr[0]})\n")
    assert not (tmp_path / "node0").exists()


@pytest.mark.slow
def test_a_node_that_dies_mid_run_is_named_with_the_resume(machines, tmp_path):
    """With dist.interface (the fix the refusal names) both nodes train; node 1's machine
    then dies (every process in its namespace SIGKILLed) once node 0 has recorded a step of
    epoch 2. An epoch is a few steps, so the run may be further on when the kill lands: the
    reason must name the epoch it was in and the last checkpoint written (the run has epochs
    enough that it cannot finish first)."""
    small = ["--epochs", "30", "--set", "data.train_size=1024", "--set", "data.test_size=64",
             "--set", "run.log_every=1", "--set", "strategy.timeout_s=60"]
    procs = [subprocess.Popen(machines.command(r, _args(
        machines, r, tmp_path, "--set", f"dist.interface={machines.veth[r]}", *small)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        for r in (0, 1)]
    try:
        deadline, run_dir = time.monotonic() + 400, None
        while run_dir is None:  # node 0 has recorded a step of epoch 2 (a checkpoint exists)
            assert time.monotonic() < deadline, "node 0 never reached epoch 2"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            for events in (tmp_path / "node0").glob("*/events.jsonl"):
                if any(e.kind == "step" and e.epoch == 2 for e in read_events(events.parent)):
                    run_dir = events.parent
            time.sleep(0.2)
        for pid in machines.pids(machines.ns[1]):
            _sh("kill", "-9", pid)
        out, err = procs[0].communicate(timeout=300)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 1, err
    last = read_events(run_dir)[-1]
    assert last.kind == "run_failed"
    died = re.match(rf"node 1 \({re.escape(machines.addr[1])}\) went away at epoch (\d+) after "
                    rf"step (\d+); the last checkpoint is (.+) \(end of epoch (\d+)\); ",
                    last.reason)
    assert died, last.reason
    epoch, step, ckpt, ckpt_epoch = died.groups()
    epoch, step, ckpt_epoch = int(epoch), int(step), int(ckpt_epoch)
    per_epoch = next(e.steps_per_epoch for e in read_events(run_dir) if e.kind == "step")
    assert epoch >= 2 and ckpt == str(run_dir / "checkpoint.pt"), last.reason
    # the checkpoint is the epoch's before, or its own when the death came after its last
    # step (at its end: evaluation, the checkpoint, the next epoch's first collective)
    assert ckpt_epoch == epoch - 1 or (ckpt_epoch == epoch and step == per_epoch), last.reason
    assert last.reason.endswith(
        f"; once every node is back, resume with `gputui resume {run_dir.name}` here and "
        f"`gputui resume` of its own run on each other node"), last.reason
    assert "peer" in last.detail  # gloo's own line, for whoever wants it
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert "Traceback" not in out + err
