"""Checks that came too late (issue 36, item 5): a text file that cannot train (empty, one
byte, shorter than one window of data.context, a device), or a warm-up longer than the run
on such text, failed inside the run (exit 1, a failed record; numpy's "both buffer length (0)
and count (-1)" for the empty file, "no file or folder" for /dev/zero). Each is refused
before launch now: the exact one line, exit 2, nothing recorded."""

from __future__ import annotations

import subprocess
import sys

import pytest

GPUTUI = [sys.executable, "-m", "gputui"]


def _refused(tmp_path, *sets: str) -> str:
    runs = tmp_path / "runs"
    done = subprocess.run([*GPUTUI, "run", "gpt-tiny", "--devices", "cpu", "--strategy",
                           "single", "--epochs", "1", "--runs-dir", str(runs),
                           "--set", "data.name=text", *sets],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert not runs.exists() or not any(runs.iterdir())  # nothing recorded
    return done.stderr.strip()


@pytest.mark.parametrize("content, context, expected", [
    (b"", 64, "gputui: error: --set data.name=text, --set data.path=t.txt: data: data.path "
              "t.txt is empty (0 bytes of text); point it at a file with text in it"),
    (b"a", 64, "gputui: error: --set data.name=text, --set data.path=t.txt: data: data.path "
               "t.txt: its training split has 0 bytes, fewer than one window of data.context "
               "+ 1 = 65; lower data.context or give more text"),
    (b"x" * 1000, 1000, "gputui: error: --set data.name=text, --set data.path=t.txt, --set "
                        "data.context=1000: data: data.path t.txt: its training split has 900 "
                        "bytes, fewer than one window of data.context + 1 = 1001; lower "
                        "data.context or give more text"),
], ids=["empty", "one-byte", "context-longer-than-the-text"])
def test_text_that_cannot_train_is_refused_before_launch(tmp_path, content, context, expected):
    (tmp_path / "t.txt").write_bytes(content)
    sets = ["--set", "data.path=t.txt"] + (["--set", f"data.context={context}"]
                                           if context != 64 else [])
    assert _refused(tmp_path, *sets) == expected


def test_a_device_as_data_path_is_named_as_one(tmp_path):
    assert _refused(tmp_path, "--set", "data.path=/dev/zero") == (
        "gputui: error: --set data.name=text, --set data.path=/dev/zero: data: data.path: "
        "/dev/zero is a character device, not a text file or folder; point it at a text file "
        "or a folder of them")


def test_a_warm_up_longer_than_the_run_on_text_is_refused_before_launch(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"some text. " * 2000)  # 22,000 bytes
    assert _refused(tmp_path, "--set", "data.path=t.txt", "--set", "optim.warmup_steps=1000") \
        == ("gputui: error: --set optim.warmup_steps=1000, --epochs, --set data.path=t.txt: "
            "optim.warmup_steps (1000) is not shorter than the run (9 optimizer steps); lower "
            "it or train longer")


def test_a_warm_up_the_capped_stdlib_text_outlasts_is_refused_before_launch(tmp_path):
    """gpt-tiny's 8 warm-up steps against 64 windows of the embedded text (2 steps of 32):
    refused in one line before any process starts, as a failed run's ranks once said after
    their start-up (found profiling a run: 25 s of start-up for a refusal)."""
    runs = tmp_path / "runs"
    done = subprocess.run([*GPUTUI, "run", "gpt-tiny", "--devices", "cpu", "--epochs", "1",
                           "--runs-dir", str(runs), "--set", "data.train_size=64"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        "gputui: error: --epochs, --set data.train_size=64: optim.warmup_steps (8) is not "
        "shorter than the run (2 optimizer steps); lower it or train longer\n")
    assert not runs.exists() or not any(runs.iterdir())
