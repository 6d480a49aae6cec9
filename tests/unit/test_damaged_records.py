"""Records and presets that are not what they should be, made of the real file kinds: a fifo,
a symlink to /dev/zero, a dangling symlink, a folder or a binary file where a file should be,
a folder that cannot be read. Listings go on with the rest and mark the bad ones; nothing
hangs (every command runs under a timeout); commands on a bad one give one line, exit 2.

Root reads a chmod-000 folder anyway, so those cases run their command with the two
capabilities that bypass permission bits dropped from its bounding set (see ``unprivileged``),
and are skipped, with the reason, where that cannot be done."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from run_records import write_record

from gputui.core import safeio
from gputui.core import runstore
from gputui.runs.history import load_rows

GPUTUI = [sys.executable, "-m", "gputui"]
TUI_TESTS = Path(__file__).resolve().parents[1] / "tui"
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def _drop_dac() -> None:
    """In the child before exec: root without the permission-bypassing capabilities."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def locked_folder(path: Path) -> dict:
    """chmod 000 ``path``; the subprocess.run kwargs under which it really cannot be read
    (skips the test where no such process can be made)."""
    path.chmod(0)
    kwargs: dict = {} if os.geteuid() != 0 else {"preexec_fn": _drop_dac}
    try:
        probe = subprocess.run([sys.executable, "-c", f"import os; os.listdir({str(path)!r})"],
                               capture_output=True, timeout=60, **kwargs)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE ({exc})")
    if probe.returncode == 0:
        pytest.skip("this process reads a chmod-000 folder (root without a way to drop its "
                    "capabilities), so no folder here is unreadable")
    return kwargs


def gputui(*args: str, cwd: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, **kwargs)


@pytest.fixture
def damaged_runs(tmp_path) -> Path:
    """A runs folder: two good runs, and runs whose events.jsonl is a fifo, a folder, a
    symlink to /dev/zero, missing (summary, config and checkpoint still there), or absent
    with only config.toml and a checkpoint left."""
    runs = tmp_path / "runs"
    write_record(runs, "20260101-100000-exp-good", "single", 1, sps=1000, acc=0.9)
    write_record(runs, "20260101-110000-exp-two", "scratch", 2, sps=1800, acc=0.9)
    for name, how in (("20260102-000000-exp-fifo", "fifo"), ("20260102-000001-exp-dir", "dir"),
                      ("20260102-000002-exp-zero", "zero"), ("20260102-000003-exp-gone", "gone"),
                      ("20260102-000004-exp-ckpt", "ckpt")):
        run_dir = write_record(runs, name, "scratch", 2, sps=1500)
        (run_dir / "checkpoint.pt").write_bytes(b"not read by listings")
        events = run_dir / "events.jsonl"
        events.unlink()
        if how == "fifo":
            os.mkfifo(events)
            (run_dir / "summary.json").unlink()
        elif how == "dir":
            events.mkdir()
        elif how == "zero":
            events.symlink_to("/dev/zero")
            (run_dir / "summary.json").unlink()
        elif how == "ckpt":
            (run_dir / "summary.json").unlink()
    return runs


def test_listing_marks_each_damaged_run_and_lists_the_rest(damaged_runs):
    rows = {r.id.rsplit("-", 1)[-1]: r for r in load_rows(damaged_runs)}
    assert sorted(rows) == ["ckpt", "dir", "fifo", "gone", "good", "two", "zero"]
    assert (rows["good"].status, rows["good"].problem) == ("finished", "")
    assert rows["fifo"].status == "unreadable"
    assert rows["fifo"].problem == "events.jsonl is a fifo (named pipe), not a file"
    assert rows["zero"].problem == "events.jsonl is a character device, not a file"
    # summary.json still says how these ended; the row says what is damaged
    assert (rows["dir"].status, rows["dir"].problem) == ("finished",
                                                         "events.jsonl is a folder, not a file")
    assert (rows["gone"].status, rows["gone"].problem) == ("finished", "events.jsonl is missing")
    assert rows["gone"].samples_per_s == 1500 and rows["gone"].strategy == "scratch"
    assert rows["ckpt"].status == "incomplete" and rows["ckpt"].batch == 256


def test_runs_and_compare_go_on_when_a_run_folder_cannot_be_read(damaged_runs):
    locked = damaged_runs / "20260103-000000-exp-locked"
    shutil.copytree(damaged_runs / "20260101-100000-exp-good", locked)
    kwargs = locked_folder(locked)
    try:
        listed = gputui("runs", "--json", "--runs-dir", str(damaged_runs), **kwargs)
        assert listed.returncode == 0, listed.stderr
        rows = {r["id"].rsplit("-", 1)[-1]: r for r in json.loads(listed.stdout)}
        assert len(rows) == 8 and rows["good"]["status"] == "finished"
        assert rows["locked"]["status"] == "unreadable"
        assert rows["locked"]["problem"] == "the folder cannot be read (Permission denied)"
        table = gputui("runs", "--runs-dir", str(damaged_runs), **kwargs)
        assert table.returncode == 0 and "20260103-000000-exp-locked: the folder cannot be " \
            "read (Permission denied)" in table.stdout
        # a good run compares while another cannot be read; so do the damaged ones
        both = gputui("compare", "--json", "--runs-dir", str(damaged_runs), "exp-two",
                      "exp-gone", "exp-dir", **kwargs)
        assert both.returncode == 0, both.stderr
        got = {r["id"].rsplit("-", 1)[-1]: r for r in json.loads(both.stdout)}
        assert got["two"]["speedup"] == pytest.approx(1.8)
        assert got["gone"]["status"] == "finished" and got["dir"]["status"] == "finished"
        resumed = gputui("resume", "--runs-dir", str(damaged_runs), locked.name, **kwargs)
        assert resumed.returncode == 2
        assert resumed.stderr == (f"gputui: error: {locked}: cannot read the run folder "
                                  f"(Permission denied); check its permissions\n")
    finally:
        locked.chmod(0o755)


def test_resume_names_an_unreadable_config_in_one_line(damaged_runs):
    run_dir = damaged_runs / "20260102-000004-exp-ckpt"
    (run_dir / "config.toml").unlink()
    os.mkfifo(run_dir / "config.toml")
    done = gputui("resume", "--runs-dir", str(damaged_runs), run_dir.name)
    assert done.returncode == 2
    assert done.stderr == (f"gputui: error: {run_dir}: config.toml is a fifo (named pipe), "
                           f"not a file\n")


def test_presets_lists_the_good_ones_and_marks_the_bad(tmp_path):
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "good.toml").write_text("# a good one\n[run]\nepochs = 1\n")
    (presets / "zero.toml").symlink_to("/dev/zero")
    os.mkfifo(presets / "fifo.toml")
    (presets / "dir.toml").mkdir()
    (presets / "binary.toml").write_bytes(bytes(range(256)) * 4)
    (presets / "dangling.toml").symlink_to(tmp_path / "nowhere.toml")
    (presets / "huge.toml").write_bytes(b"# big\n" + b"#" * (safeio.SMALL_LIMIT + 10))
    done = gputui("presets", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = {p["name"]: p for p in json.loads(done.stdout)}
    assert found["good"]["problem"] == "" and found["good"]["description"] == "a good one"
    assert found["quickstart"]["problem"] == ""  # the project's own presets are still listed
    assert found["zero"]["problem"] == ("cannot read the preset (zero.toml is a character "
                                        "device, not a file)")
    assert found["fifo"]["problem"] == ("cannot read the preset (fifo.toml is a fifo (named "
                                        "pipe), not a file)")
    assert found["dir"]["problem"] == "cannot read the preset (dir.toml is a folder, not a file)"
    assert found["binary"]["problem"].startswith("is not UTF-8 text")
    assert found["dangling"]["problem"].startswith("is a link to ")
    assert "too large" in found["huge"]["problem"]
    table = gputui("presets", cwd=tmp_path)
    assert table.returncode == 0
    assert "fifo                     [cannot be loaded: cannot read the preset" in table.stdout
    run = gputui("run", "fifo", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "fifo (named pipe)" in run.stderr


def test_a_presets_folder_that_cannot_be_read_hides_only_itself(tmp_path):
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "mine.toml").write_text("[run]\nepochs = 1\n")
    kwargs = locked_folder(presets)
    try:
        done = gputui("presets", "--json", cwd=tmp_path, **kwargs)
    finally:
        presets.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert "quickstart" in {p["name"] for p in json.loads(done.stdout)}


HISTORY_SCRIPT = """
import asyncio, json, sys, time
sys.path.insert(0, {tui!r})
from scripted import ScriptedLauncher, fixed_inventory
from gputui.tui.app import make_app
from gputui.tui.screens.history import HistoryScreen

async def main():
    app = make_app(runs_dir={runs!r}, launcher=ScriptedLauncher(), inventory=fixed_inventory(),
                   presets=[])
    async with app.run_test(size=(160, 44)) as pilot:
        await pilot.press("f6")
        deadline = time.monotonic() + 240
        while not (isinstance(app.screen, HistoryScreen) and app.screen.loaded):
            assert time.monotonic() < deadline, "the history never loaded"
            await pilot.pause(0.05)
        print(json.dumps({{i: r.status for i, r in app.screen.rows.items()}}))

asyncio.run(main())
"""


def test_the_apps_history_lists_every_run_around_an_unreadable_one(damaged_runs):
    locked = damaged_runs / "20260103-000000-exp-locked"
    shutil.copytree(damaged_runs / "20260101-100000-exp-good", locked)
    kwargs = locked_folder(locked)
    script = HISTORY_SCRIPT.format(tui=str(TUI_TESTS), runs=str(damaged_runs))
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120, **kwargs)
    finally:
        locked.chmod(0o755)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = {k.rsplit("-", 1)[-1]: v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}
    assert shown == {"locked": "unreadable", "ckpt": "incomplete", "gone": "finished",
                     "zero": "unreadable", "dir": "finished", "fifo": "unreadable",
                     "two": "finished", "good": "finished"}


def test_readers_refuse_special_files_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    for name, words in (("fifo", "a fifo (named pipe)"), ("zero", "a character device")):
        with pytest.raises(safeio.Unreadable, match=re.escape(f"{name} is {words}, not a")):
            safeio.read_text(tmp_path / name)
        with pytest.raises(safeio.Unreadable):
            list(safeio.iter_lines(tmp_path / name))
    lines = tmp_path / "lines"
    lines.write_bytes(b"a\n" + b"x" * 100 + b"\nb\n" + b"y" * 100)
    assert list(safeio.iter_lines(lines, max_line=50)) == ["a", "b"]  # long lines skipped
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").mkdir()
    with pytest.raises(safeio.Unreadable, match="events.jsonl is a folder"):
        runstore.read_events(run_dir)
    assert runstore.read_summary(run_dir).status_text == "unreadable"
