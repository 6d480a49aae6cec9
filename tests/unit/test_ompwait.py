"""How gputui's training processes wait (gputui.core.ompwait): passively unless the user set
OMP_WAIT_POLICY, set before torch loads in every child (the run host, ddp's ranks through the
fork server), and said in the record (summary.json's omp_wait, from the child's own view)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
SMALL = ["--epochs", "1", "--set", "data.train_size=256", "--set", "data.test_size=64",
         "--set", "model.name=mlp"]


def run(tmp_path, wait: str | None, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GPUTUI_OMP_WAIT_DEFAULT")}
    if wait is not None:
        env["OMP_WAIT_POLICY"] = wait
    proc = subprocess.run([sys.executable, "-m", "gputui", "run", "quickstart", *SMALL, *extra,
                           "--runs-dir", str(tmp_path / "runs"), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_runs_wait_passively_by_default_and_say_so(tmp_path):
    summary = run(tmp_path, None, "--set", "strategy.name=ddp", "--devices", "cpu*2")
    assert summary["omp_wait"] == "passive (gputui's default)"  # rank 0's own environment
    on_disk = json.loads((tmp_path / "runs" / summary["run_id"] / "summary.json").read_text())
    assert on_disk["omp_wait"] == "passive (gputui's default)"
    assert "machine" in summary and "baseline_warning" in summary  # the run's verdict


def test_the_users_own_policy_is_kept_and_named(tmp_path):
    summary = run(tmp_path, "ACTIVE")
    assert summary["omp_wait"] == "active (OMP_WAIT_POLICY set by the user)"


def test_described_names_the_source():
    from gputui.core import ompwait

    env = {"OMP_WAIT_POLICY": "PASSIVE", "GPUTUI_OMP_WAIT_DEFAULT": "1"}
    code = "from gputui.core import ompwait; print(ompwait.described())"
    for given, expected in ((env, "passive (gputui's default)"),
                            ({"OMP_WAIT_POLICY": "passive"}, "passive (OMP_WAIT_POLICY set "
                                                             "by the user)"),
                            ({}, "active (OpenMP's default: spinning)")):
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("OMP_WAIT_POLICY", "GPUTUI_OMP_WAIT_DEFAULT")}
        out = subprocess.run([sys.executable, "-c", code], env={**clean, **given},
                             capture_output=True, text=True, timeout=60).stdout.strip()
        assert out == expected
    assert ompwait.spins("active (OpenMP's default: spinning)")
    assert not ompwait.spins("passive (gputui's default)")
