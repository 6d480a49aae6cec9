"""The example of your own model and data (examples/): a real headless run from another folder,
a resume of it, and a 2-point sweep over devices, each through the `gputui` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "examples" / "tiny.toml"
GPUTUI = [sys.executable, "-m", "gputui"]
pytestmark = pytest.mark.slow


def gputui(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One epoch of the example, run from a folder that is not the repository (the preset's
    factory paths are found beside the preset)."""
    where = tmp_path_factory.mktemp("elsewhere")
    proc = gputui("run", str(PRESET), "--epochs", "1", "--json", "--runs-dir", "runs",
                  cwd=where)
    return proc, where


def test_the_example_trains_headless_and_says_it_runs_code(first_run):
    proc, _ = first_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["status"] == "finished"
    assert summary["model"] == f"{REPO / 'examples' / 'tiny_model.py'}:build"
    assert summary["dataset"] == f"{REPO / 'examples' / 'tiny_data.py'}:stripes"
    assert summary["per_epoch"][0]["test_acc"] > 0.4  # four classes: chance is 0.25
    assert summary["params"] > 1000
    # the progress output (stderr with --json) named the code before the run started
    assert "runs your code: model.factory = " in proc.stderr


def test_the_example_resumes_to_more_epochs(first_run):
    proc, where = first_run
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    again = gputui("resume", str(where / run_dir), "--epochs", "2", "--json", cwd=where)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["status"] == "finished" and summary["epochs_done"] == 2
    assert [e["epoch"] for e in summary["per_epoch"]] == [2]  # epoch 1 came from the checkpoint
    assert any(n.startswith("resumed from") for n in summary["notes"])


def test_the_example_sweeps_over_devices(tmp_path):
    proc = gputui("sweep", str(PRESET), "--devices", "1,2", "--strategies", "scratch",
                  "--epochs", "1", "--runs-dir", str(tmp_path), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout)["runs"]
    assert sorted((r["strategy"], r["devices"]) for r in runs) == [("scratch", 1), ("scratch", 2)]
    assert all(r["status"] == "finished" for r in runs)
    # compared as built-in runs are: the model named, the 2-device run against the 1-device one
    assert {r["model"] for r in runs} == {f"{REPO / 'examples' / 'tiny_model.py'}:build"}
    one = next(r for r in runs if r["devices"] == 1)
    for r in runs:  # each against the 1-device run, unless one of the two ran in another
        # machine state (the other tests beside it: then no speedup, and the refusal says why)
        if r["contended"] == one["contended"]:
            assert r["baseline"] == one["id"] and r["speedup"] > 0, r
        else:
            assert r["speedup"] is None and "another machine state" in " ".join(r["refused"])


def test_dry_run_shows_the_factory_not_the_built_in_name_it_replaces(tmp_path):
    """`--dry-run` of a factory model printed name = "lenet", a model the run never builds."""
    import tomllib

    proc = gputui("run", str(PRESET), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = tomllib.loads(proc.stdout)
    assert "name" not in shown["model"] and shown["model"]["factory"].endswith("tiny_model.py:build")
    assert "name" not in shown["data"] and "lenet" not in proc.stdout
    proc = gputui("run", str(PRESET), "--dry-run", "--json", cwd=tmp_path)
    assert "name" not in json.loads(proc.stdout)["model"]
