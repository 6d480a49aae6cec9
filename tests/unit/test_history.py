"""Run history: rows from records (damaged ones included), filters, `gputui runs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputui import cli
from gputui.runs import history
from run_records import truncate_record, write_record


@pytest.fixture
def runs(tmp_path) -> Path:
    base = tmp_path / "runs"
    write_record(base, "20260101-100000-exp-aaaa", "single", 1, batch=256, lr=0.1, sps=1000,
                 acc=0.91)
    write_record(base, "20260101-110000-exp-bbbb", "scratch", 2, batch=256, lr=0.1, sps=1600,
                 acc=0.90, scale=True, comm=0.2)
    write_record(base, "20260101-120000-other-cccc", "ddp", 2, status="failed", name="other")
    torn = write_record(base, "20260101-130000-exp-dddd", "scratch", 2, sps=1500)
    truncate_record(torn, keep_lines=4)  # started, init, epoch 1, a torn line; writer gone
    old = time.time() - 3600
    bad = write_record(base, "20260101-140000-exp-eeee", "single", 1, sps=900)
    (bad / "summary.json").write_text('{"status": "fini')  # cut mid-write
    listy = write_record(base, "20260101-150000-exp-ffff", "single", 1, sps=950)
    (listy / "summary.json").write_text("[1, 2]")  # valid JSON, wrong shape
    junk = base / "20260101-160000-exp-gggg"
    junk.mkdir()
    (junk / "events.jsonl").write_bytes(b"\xff\xfe garbage\n{not json\n")
    os.utime(junk / "events.jsonl", (old, old))
    (base / "sweeps").mkdir()  # a folder without events.jsonl is not a run
    return base


def test_rows_carry_the_table_columns(runs):
    rows = {r.id: r for r in history.load_rows(runs)}
    assert len(rows) == 7
    single = rows["20260101-100000-exp-aaaa"]
    assert (single.name, single.strategy, single.devices, single.batch, single.lr) == \
        ("exp", "single", 1, 256, 0.1)
    assert single.samples_per_s == 1000 and single.test_acc == 0.91
    assert single.time_per_epoch_s == pytest.approx(1.0) and single.status == "finished"
    assert single.date == "2026-01-01 10:00:00"
    scaled = rows["20260101-110000-exp-bbbb"]
    assert (scaled.devices, scaled.batch, scaled.lr) == (2, 512, 0.2)  # scale_with_devices
    assert rows["20260101-120000-other-cccc"].status == "failed"
    assert rows["20260101-120000-other-cccc"].reason == "boom"


def test_damaged_records_are_listed_not_fatal(runs):
    rows = {r.id: r for r in history.load_rows(runs)}
    torn = rows["20260101-130000-exp-dddd"]
    assert torn.status == "incomplete" and torn.epochs_done == 1
    assert torn.samples_per_s is None and torn.no_speed.startswith("incomplete")  # issue 24
    assert rows["20260101-140000-exp-eeee"].status == "finished"  # rebuilt from the events
    assert rows["20260101-140000-exp-eeee"].samples_per_s == 900
    assert rows["20260101-150000-exp-ffff"].status == "finished"
    junk = rows["20260101-160000-exp-gggg"]
    assert junk.strategy == "" and junk.samples_per_s is None and junk.status == "incomplete"


def test_a_stopped_language_models_tokens_per_s_is_no_speed_either(tmp_path):
    """A part of a run is no speed figure: a stopped language model's tokens/s is blank as
    its samples/s is (History showed 16,750 tokens/s beside a '-' samples/s)."""
    write_record(tmp_path, "20260101-100000-lm-aaaa", model="gpt", task="lm")
    write_record(tmp_path, "20260101-110000-lm-bbbb", model="gpt", task="lm", status="stopped")
    rows = {r.id: r for r in history.load_rows(tmp_path)}
    done, stopped = rows["20260101-100000-lm-aaaa"], rows["20260101-110000-lm-bbbb"]
    assert done.tokens_per_s == pytest.approx(done.samples_per_s * 64)
    assert stopped.samples_per_s is None and stopped.tokens_per_s is None
    assert stopped.no_speed.startswith("stopped")


def test_a_fresh_record_without_end_is_still_running(tmp_path):
    run = write_record(tmp_path, "20260101-100000-live-aaaa", summary=False)
    truncate_record(run, keep_lines=3, torn="", age_s=0)
    assert history.row_for(run).status == "running"


def test_filters(runs):
    rows = history.load_rows(runs)
    assert [r.id for r in history.filter_rows(rows, strategy="scratch")] == \
        ["20260101-130000-exp-dddd", "20260101-110000-exp-bbbb"]
    assert {r.strategy for r in history.filter_rows(rows, strategy="ddp,single")} == \
        {"ddp", "single"}
    assert [r.id for r in history.filter_rows(rows, status="failed")] == \
        ["20260101-120000-other-cccc"]
    assert [r.id for r in history.filter_rows(rows, name="OTHER")] == \
        ["20260101-120000-other-cccc"]
    assert [r.id for r in history.filter_rows(rows, last=2)] == \
        ["20260101-160000-exp-gggg", "20260101-150000-exp-ffff"]
    assert history.filter_rows(rows, strategy="scratch", status="finished", last=5)[0].id == \
        "20260101-110000-exp-bbbb"


def test_find_run(runs):
    assert history.find_run("bbbb", runs).name == "20260101-110000-exp-bbbb"
    assert history.find_run(str(runs / "20260101-110000-exp-bbbb")).name.endswith("bbbb")
    with pytest.raises(LookupError, match="ambiguous"):
        history.find_run("20260101", runs)
    with pytest.raises(LookupError, match="no run 'zzzz'"):
        history.find_run("zzzz", runs)


def test_cli_runs_json_and_filters(runs, capsys):
    assert cli.main(["runs", "--runs-dir", str(runs), "--json", "--strategy", "scratch"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["id"] for d in data] == ["20260101-130000-exp-dddd", "20260101-110000-exp-bbbb"]
    assert set(history.COLUMNS) <= set(data[0])


def test_cli_runs_table_lists_every_run(runs, capsys):
    assert cli.main(["runs", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    for col in ("strategy", "batch", "time/epoch", "samples/s", "test acc", "status", "date"):
        assert col in out
    assert "20260101-100000-exp-aaaa" in out and "incomplete" in out and "1,000" in out


def test_cli_runs_bad_input_one_line(runs, capsys):
    assert cli.main(["runs", "--runs-dir", str(runs), "--last", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--last 0" in err


def test_cli_runs_empty(tmp_path, capsys):
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "none")]) == 0
    assert "no runs recorded yet" in capsys.readouterr().out


def test_cli_modules_do_not_import_torch():
    code = ("import sys, gputui.cli as c; c.build_parser(); "
            "import gputui.runs.history, gputui.runs.compare.table, gputui.runs.compare.export, "
            "gputui.runs.sweep.runner, gputui.runs.sweep.progress, gputui.cli.sweep, "
            "gputui.cli.bench_comm; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_runs_last_is_the_newest_by_when_it_started_not_by_folder_name(tmp_path, capsys):
    """Two runs of one second (ids differ only in their random tail) and a folder named by
    hand: `runs --last 1` named the one whose folder sorted last."""
    base = tmp_path / "runs"
    write_record(base, "20260101-100000-exp-ffff", "single", 1)  # started first
    newer = write_record(base, "20260101-100000-exp-0000", "single", 1)
    lines = (newer / "events.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["t"] += 0.5  # half a second later, in the same second of its id
    (newer / "events.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n",
                                        encoding="utf-8")
    (newer / "summary.json").unlink()  # the started time read from the record's first line
    assert [r.id for r in history.filter_rows(history.load_rows(base), last=1)] == \
        ["20260101-100000-exp-0000"]
    hand = write_record(base, "zzz-my-copy", "single", 1)  # no time in its name
    old = time.time() - 86400 * 365 * 30
    for p in hand.iterdir():
        os.utime(p, (old, old))
    assert cli.main(["runs", "--runs-dir", str(base), "--last", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == "20260101-100000-exp-0000"
