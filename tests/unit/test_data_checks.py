"""Data checked before a run starts: messages that name the fix, sizes the dataset cannot
give refused with exit 2, and a dry run that leaves data.root as it was."""

from __future__ import annotations

import subprocess
import sys

from gputui.core.config import RunConfig, apply_overrides
from gputui.core.datafiles import data_problem, missing_data

from test_data import _write_idx

GPUTUI = [sys.executable, "-m", "gputui"]


def _cfg(*layers: dict, **changes) -> RunConfig:
    merged = {k: v for layer in layers for k, v in layer.items()}
    merged.update(changes)
    return apply_overrides(RunConfig(), [("test", k, v) for k, v in merged.items()])


def _tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_only_the_test_files_suggest_the_test_split_source(tmp_path):
    _write_idx(tmp_path / "MNIST" / "raw", "test", 50, seed=1, packed=True)
    msg = missing_data("mnist", str(tmp_path))
    assert msg.startswith("mnist: missing train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz "
                          f"in {tmp_path / 'MNIST' / 'raw'} (the test split is there: "
                          "--set data.source=test-split trains and tests on parts of it); "
                          "download them from https://ossci-datasets.s3.amazonaws.com/mnist/")
    assert "t10k" not in msg and "--set data.name=synthetic" in msg
    cifar = missing_data("cifar10", str(tmp_path))
    assert "extract https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz into" in cifar


def test_sizes_the_dataset_cannot_give_are_named_before_start(tmp_path):
    root = str(tmp_path)
    _write_idx(tmp_path / "MNIST" / "raw", "test", 100, seed=1, packed=True)
    _write_idx(tmp_path / "MNIST" / "raw", "train", 300, seed=2, packed=False)
    base = {"data.name": "mnist", "data.root": root, "optim.batch_size": 16}
    assert data_problem(_cfg(base)) is None
    assert data_problem(_cfg(base, {"data.source": "test-split"})) is None
    assert data_problem(_cfg(base, {"data.source": "test-split", "data.train_size": 90,
                                        "data.test_size": 30})) == (
        "data.train_size + data.test_size (90 + 30) exceed the 100 examples of mnist's test "
        "split (data.source = test-split); lower them, e.g. --set data.train_size=80 "
        "--set data.test_size=20")
    assert "(100 + 0) exceed" in data_problem(_cfg(base, {"data.source": "test-split",
                                                              "data.train_size": 100}))
    assert data_problem(_cfg(base, {"data.train_size": 301})) == (
        "data.train_size (301) exceeds the 300 examples of mnist's train split; lower it "
        "(0 = all)")
    assert "data.test_size (101) exceeds the 100 examples" in data_problem(
        _cfg(base, {"data.test_size": 101}))
    assert data_problem(_cfg(base, {"optim.batch_size": 400})) == (
        "optim.batch_size (400) is larger than the training set (300 examples); lower it or "
        "raise data.train_size")
    assert "(12000 examples)" in data_problem(_cfg({"optim.batch_size": 12001}))


def test_quickstart_on_a_test_split_folder_exits_2_before_start_and_dry_run_writes_nothing(
        tmp_path):
    _write_idx(tmp_path / "data" / "MNIST" / "raw", "test", 100, seed=1, packed=True)
    before = _tree(tmp_path)
    common = ["run", "quickstart", "--set", "data.name=mnist", "--set",
              f"data.root={tmp_path / 'data'}", "--runs-dir", str(tmp_path / "runs")]
    dry = subprocess.run([*GPUTUI, *common, "--set", "data.source=test-split", "--set",
                          "data.train_size=80", "--set", "data.test_size=20", "--batch-size", "16",
                          "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert _tree(tmp_path) == before  # no .gz decompressed, no runs folder
    bad = subprocess.run([*GPUTUI, *common, "--set", "data.source=test-split"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.endswith("data: data.train_size + data.test_size (12000 + 2000) exceed the "
                               "100 examples of mnist's test split (data.source = test-split); "
                               "lower them, e.g. --set data.train_size=80 "
                               "--set data.test_size=20\n")
    assert bad.stderr.count("\n") == 1 and _tree(tmp_path) == before
