"""A full disk and refused writes, for real: a small tmpfs that fills up (mounted by root; the
tests that need it skip with the reason elsewhere), a read-only folder, a path that is a file.
Each checks the one-line message, the exit status, that no temporary file is left and that
the record stays readable and ends."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputui import cli
from gputui.core.filewrite import AppendLog, WriteFailed, write_atomic, write_with
from gputui.core.runstore import RESERVE_BYTES, RESERVE_NAME

GPUTUI = [sys.executable, "-m", "gputui"]
TINY = ["--devices", "cpu", "--strategy", "single", "--batch-size", "64", "--set",
        "model.name=mlp", "--set", "data.train_size=1024", "--set", "data.test_size=128",
        "--set", "telemetry.enabled=false"]


@contextlib.contextmanager
def tmpfs(where: Path, size: str):
    """A real file system of ``size`` at ``where``; skips when it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a real full disk) needs root")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def read_only_folder(where: Path):
    """A folder nobody can write in: chmod 0o555, or for root (who ignores permission bits)
    a tmpfs remounted read-only."""
    if os.geteuid() != 0:
        where.mkdir()
        where.chmod(0o555)
        try:
            yield where
        finally:
            where.chmod(0o755)
        return
    with tmpfs(where, "64k"):
        done = subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only here: {done.stderr.strip()}")
        yield where


def fill(folder: Path, leave: int = 0) -> None:
    """Fill the file system of ``folder`` until ``leave`` bytes are free."""
    st = os.statvfs(folder)
    with open(folder / "filler", "wb") as fh:
        fh.write(bytes(max(0, st.f_bavail * st.f_frsize - leave)))


def leftovers(root: Path) -> list[str]:
    """Temporary or reserve files anywhere below ``root``."""
    return [str(p) for p in root.rglob("*") if p.name.endswith(".tmp") or
            p.name == RESERVE_NAME or p.name.startswith(".gputui-probe")]


def check_record(run_dir: Path) -> list[dict]:
    """Every line of events.jsonl parses; returns the events."""
    text = (run_dir / "events.jsonl").read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


# ------------------------------------------------------------------ the writers
def test_a_failed_append_is_cut_back_to_the_last_whole_line(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as disk:
        log = AppendLog(disk / "events.jsonl")
        line = json.dumps({"pad": "x" * 3000}) + "\n"
        with pytest.raises(WriteFailed) as info:
            for _ in range(100):
                log.append(line)
        log.close()
        assert str(info.value).startswith(f"cannot write {disk / 'events.jsonl'}: No space")
        text = (disk / "events.jsonl").read_text()
        assert text and text.endswith("\n") and all(json.loads(x) for x in text.splitlines())


def test_a_failed_atomic_write_keeps_the_previous_file_and_no_temporary(tmp_path):
    import torch

    with tmpfs(tmp_path / "disk", "256k") as disk:
        path = disk / "checkpoint.pt"
        write_with(path, lambda fh: torch.save({"w": torch.ones(10)}, fh))
        # torch.save on a full disk raises RuntimeError "unexpected pos": WriteFailed here
        with pytest.raises(WriteFailed, match=r"checkpoint.pt: No space left on device"):
            write_with(path, lambda fh: torch.save({"w": torch.ones(200_000)}, fh))
        assert torch.load(path, weights_only=True)["w"].shape == (10,)
        fill(disk)
        with pytest.raises(WriteFailed, match="summary.json: No space"):
            write_atomic(disk / "summary.json", "x" * 10_000)
        assert leftovers(disk) == []


# ------------------------------------------------------------------ a run on a full disk
def _run(runs: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, "run", "quickstart", *TINY, "--runs-dir", str(runs),
                           *extra], capture_output=True, text=True, timeout=120)


def _assert_failed_run(runs: Path, done: subprocess.CompletedProcess, file: str) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out and "inline_container" not in out, out
    [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
    assert f"cannot write {run_dir / file}: No space left on device" in out, out
    events = check_record(run_dir)
    assert events[-1]["type"] == "run_failed"
    assert events[-1]["reason"].startswith(f"cannot write {run_dir / file}")
    listed = subprocess.run([*GPUTUI, "runs", "--runs-dir", str(runs), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert [r["status"] for r in json.loads(listed.stdout)] == ["failed"]
    assert leftovers(runs) == []


def test_a_checkpoint_larger_than_the_disk_ends_the_run_with_one_line(tmp_path):
    with tmpfs(tmp_path / "disk", "600k") as disk:
        runs = disk / "runs"
        _assert_failed_run(runs, _run(runs, "--epochs", "1"), "checkpoint.pt")


def test_a_disk_that_fills_during_the_run_leaves_whole_lines_and_an_ended_record(tmp_path):
    with tmpfs(tmp_path / "disk", "600k") as disk:
        runs = disk / "runs"
        runs.mkdir()
        # room for config.toml, the reserve and a few events; 40 epochs write far more
        page = os.sysconf("SC_PAGE_SIZE")
        fill(disk, leave=page + -(-RESERVE_BYTES // page) * page + 3 * page)
        done = _run(runs, "--epochs", "40", "--set", "run.checkpoint=false",
                    "--set", "run.log_every=1")
        (disk / "filler").unlink()
        _assert_failed_run(runs, done, "events.jsonl")


# ------------------------------------------------------------------ outputs checked first
def _one_line_error(capsys, argv: list[str], *words: str) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, capsys):
    runs = tmp_path / "runs"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    for command in (["run", "quickstart", *TINY], ["sweep", "quickstart", "--devices", "1"]):
        for where in (a_file, a_file / "sub"):
            _one_line_error(capsys, [*command, "--runs-dir", str(where)], "--runs-dir",
                            "is a file, not a folder")
    with read_only_folder(tmp_path / "ro") as ro:
        for command in (["run", "quickstart", *TINY], ["sweep", "quickstart", "--devices", "1"]):
            _one_line_error(capsys, [*command, "--runs-dir", str(ro / "runs")], "--runs-dir")
        _one_line_error(capsys, ["sweep", "quickstart", "--devices", "1", "--runs-dir",
                                 str(runs), "--export", str(ro / "out")], "--export", str(ro))
        assert not runs.exists() or not any(runs.iterdir())  # no point ran
        for flag, value in (("-o", ro / "t.csv"), ("--plots", ro / "p"),
                            ("--tensorboard", ro / "tb")):
            _one_line_error(capsys, ["compare", "some-run", "--runs-dir", str(runs),
                                     "--format", "csv", flag, str(value)], str(ro))
        _one_line_error(capsys, ["compare", "some-run", "--format", "csv", "-o", str(tmp_path)],
                        "is a folder")
        assert list(ro.iterdir()) == [] and not runs.exists()  # the checks leave nothing
