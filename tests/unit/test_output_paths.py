"""An output path is written *to*, as every Unix tool does: a device or a named pipe gets the
bytes, a symbolic link is followed (the link stays, its target gets the text), a regular file
is replaced atomically; a failed write says why in one line with exit 2."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from gputui import cli
from gputui.core.filewrite import WriteFailed, file_problem, write_atomic
from run_records import write_record


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    write_record(folder, "20260101-000000-a")
    return folder


def test_a_symlink_is_followed_and_kept(tmp_path, runs, capsys):
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    code, _, err = run_cli(capsys, "runs", "--runs-dir", str(runs), "--format", "csv",
                           "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "20260101-000000-a" in target.read_text()


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "made.txt")
    write_atomic(link, "x\n")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "x\n"


def test_a_named_pipe_gets_the_bytes(tmp_path, runs, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = run_cli(capsys, "runs", "--runs-dir", str(runs), "--format", "csv",
                           "-o", str(fifo))
    reader.join(timeout=60)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still a pipe, not replaced by a file
    assert b"20260101-000000-a" in got[0]


def device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device of our own (1, minor: 3 is null, 7 is full), never the system's:
    a broken writer here replaces only a node in tmp_path."""
    path = tmp_path / name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


def test_a_null_device_gets_the_bytes_and_stays_a_device(tmp_path, runs, capsys):
    null = device(tmp_path, "null", 3)
    code, _, err = run_cli(capsys, "runs", "--runs-dir", str(runs), "--format", "csv",
                           "-o", str(null))
    assert code == 0, err
    assert stat.S_ISCHR(null.stat().st_mode)


def test_a_full_device_fails_in_one_line_and_stays_a_device(tmp_path, runs, capsys):
    full = device(tmp_path, "full", 7)
    code, _, err = run_cli(capsys, "runs", "--runs-dir", str(runs), "--format", "csv",
                           "-o", str(full))
    assert code == 2
    assert stat.S_ISCHR(full.stat().st_mode)
    assert err.strip().count("\n") == 0 and str(full) in err and "space" in err.lower()
    with pytest.raises(WriteFailed, match="No space left"):
        write_atomic(full, "x")
    assert stat.S_ISCHR(full.stat().st_mode)


def test_compare_output_follows_a_symlink(tmp_path, runs, capsys):
    target = tmp_path / "cmp.md"
    target.write_text("old\n")
    link = tmp_path / "cmp-link.md"
    link.symlink_to(target)
    code, _, err = run_cli(capsys, "compare", "20260101-000000-a", "--runs-dir", str(runs),
                           "--format", "md", "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and "20260101-000000-a" in target.read_text()


def test_a_regular_file_is_replaced_whole(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("a much longer old content\n" * 10)
    write_atomic(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]  # no temporary left


def test_no_empty_brackets_in_a_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for problem in (file_problem(blocker / "sub" / "x.csv", "--output"),
                    str(WriteFailed(tmp_path / "nope" / "x",
                                    FileNotFoundError(2, "No such file or directory")))):
        assert problem and "()" not in problem, problem


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_the_processs_own_stdout_through_proc_gets_the_bytes(tmp_path, runs):
    """``-o /proc/self/fd/1`` (or /dev/stdout) with stdout a pipe: the kernel follows the link
    to the pipe, where realpath makes a name that does not exist ("pipe:[1234]"); it said the
    folder does not exist."""
    import subprocess
    import sys

    for out in ("/proc/self/fd/1", "/dev/stdout"):
        done = subprocess.run([sys.executable, "-m", "gputui", "runs", "--runs-dir", str(runs),
                               "--format", "csv", "-o", out], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "20260101-000000-a" in done.stdout
