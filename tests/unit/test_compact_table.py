"""compare and sweep print a compact table by default that fits 100 columns: every header
whole on one row with its unit, no unit wrapped under it; --wide prints every column; --json
keeps every field. In-process, on records in the real format."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from gputui import cli
from gputui.cli import compact
from gputui.core.breakdown import make
from gputui.runs.sweep.runner import Manifest, Point
from run_records import write_record

ROOT = Path(__file__).resolve().parents[2]
NAME = "lenet-scratch-2dev"  # the longest name of a shipped preset a sweep is run on
IDS = {("single", 1): f"20261123-060104-{NAME}-0cdb",
       ("scratch", 2): f"20261123-061500-{NAME}-77aa", ("ddp", 2): f"20261123-070000-{NAME}-b1c2",
       ("model_parallel", 2): f"20261123-071000-{NAME}-c3d4"}


@pytest.fixture
def runs(tmp_path) -> Path:
    base = tmp_path / "runs"
    steady = make(span_s=0.09, data_s=0.01, compute_s=0.05, optimizer_s=0.01,
                  comm_exposed_s=0.02, comm_overlap_s=0.01)
    for (strategy, n), run_id in IDS.items():
        write_record(base, run_id, strategy, n, sps=1000 * (1 + n / 3), epochs=3, windows=3,
                     name=NAME, comm=0.1 if n > 1 else None,
                     breakdowns=[make(1.0, 0.0, 1.0, 0.0), steady, steady])
    Manifest(sweep_id="20261123-080000-lenet-scratch-2dev-aaaa", preset=str(
        ROOT / "presets" / "quickstart.toml"), devices=["1", "2"], state="finished",
        strategies=["single", "scratch", "ddp", "model_parallel"],
        points=[Point(s, str(n), f"cpu*{n}" if n > 1 else "cpu", status="finished",
                      run_id=run_id) for (s, n), run_id in IDS.items()]).save(base)
    return base


def _terminal(monkeypatch, capsys, argv: list[str], width: int = 100) -> str:
    """What `gputui ARGV` prints on a terminal ``width`` columns wide, colours stripped."""
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.main(argv) == 0
    return re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)


def _check_compact(text: str) -> None:
    lines = text.splitlines()
    (header,) = [ln for ln in lines if ln.startswith("run ")]
    words = [compact.HEADERS[c] for c in compact.COLUMNS]
    assert [w for w in words if w not in header] == [], header  # every header whole, one row
    rule = lines.index(header) + 1
    assert set(lines[rule].strip()) == {"─"}  # the rule right under it: no second header row
    table = lines[rule - 1:rule + 1 + len(IDS)]
    assert max(len(ln) for ln in table) <= 100, "\n".join(table)
    for (strategy, _), run_id in IDS.items():  # each run on one row, its id part whole
        (row,) = [ln for ln in table if run_id.split("-", 2)[2] in ln]
        assert f" {strategy} " in row
    assert "step breakdown" not in text  # the legend of --wide's columns


def test_compare_prints_the_compact_table_at_100_columns(runs, monkeypatch, capsys):
    text = _terminal(monkeypatch, capsys, ["compare", *(i for i in IDS.values()), "--runs-dir",
                                           str(runs)])
    _check_compact(text)
    assert re.search(r"ddp\s+2\s+0\.60\s+1,667\s+1\.25 ±[\d.]+\s+62 ±\d+\s+90\.00", text), text


def test_sweep_prints_the_compact_table_at_100_columns(runs, monkeypatch, capsys):
    text = _terminal(monkeypatch, capsys, ["sweep", "--resume", "aaaa", "--runs-dir",
                                           str(runs)])
    _check_compact(text)


def test_wide_prints_every_column_and_json_every_field(runs, monkeypatch, capsys):
    argv = ["compare", *(i for i in IDS.values()), "--runs-dir", str(runs)]
    text = _terminal(monkeypatch, capsys, [*argv, "--wide"])
    for header in ("time/epoch", "efficiency", "compute", "exposed", "train mem", "init",
                   "status", "baseline", "check"):
        assert header in text  # whole, even where the terminal is narrower than the table
    assert "step breakdown" in text
    assert cli.main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(IDS) and {"compute_share", "init_s", "status", "speedup"} <= \
        set(rows[0])
