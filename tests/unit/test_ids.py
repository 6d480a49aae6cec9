"""RUN and SWEEP_ID: the whole id or any unique part of it, the same for every command that
takes one (compare, compare --sweep, resume, sweep --resume); a part several ids hold is one
line naming them, exit 2. In-process, on records written in the real format."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputui import cli
from gputui.runs.ids import find_run, find_sweep, match_id
from gputui.runs.sweep.runner import Manifest, Point, load_manifest
from run_records import write_record

IDS = ["20261123-060104-quickstart-0cdb", "20261123-061500-quickstart-77aa",
       "20261123-070000-lenet-ddp-2dev-b1c2"]


@pytest.fixture
def runs(tmp_path) -> Path:
    base = tmp_path / "runs"
    for run_id in IDS:
        write_record(base, run_id, epochs=1)
    Manifest(sweep_id="20261123-080000-quickstart-aaaa", preset="quickstart",
             points=[Point("single", "1", "cpu", status="finished", run_id=IDS[0])]
             ).save(base)
    Manifest(sweep_id="20261124-090000-tiny-bbbb", preset="tiny").save(base)
    return base


def test_a_part_from_the_middle_finds_the_one_run(runs):
    assert find_run("060104", runs).name == IDS[0]  # neither a prefix nor a suffix
    assert find_run("ddp-2dev", runs).name == IDS[2]
    assert find_run(IDS[1], runs).name == IDS[1]
    assert find_run(str(runs / IDS[1])).name == IDS[1]


def test_an_ambiguous_part_names_the_candidates(runs):
    with pytest.raises(LookupError) as exc:
        find_run("quickstart", runs)
    text = str(exc.value)
    assert "ambiguous" in text and IDS[0] in text and IDS[1] in text and IDS[2] not in text
    with pytest.raises(LookupError, match="no run 'zzzz'"):
        find_run("zzzz", runs)


def test_many_candidates_are_counted_past_the_first_few():
    ids = [f"run-{i:02d}" for i in range(10)]
    with pytest.raises(LookupError, match=r"10 runs match \(run-00, .*run-05 and 4 more\)"):
        match_id("run", ids, "run", "runs")


def test_a_sweep_by_a_unique_part(runs):
    assert find_sweep("aaaa", runs) == "20261123-080000-quickstart-aaaa"
    assert load_manifest(runs, "tiny").sweep_id == "20261124-090000-tiny-bbbb"
    with pytest.raises(LookupError, match="ambiguous"):
        find_sweep("2026112", runs)


def test_compare_takes_a_middle_part_and_refuses_an_ambiguous_one(runs, capsys):
    assert cli.main(["compare", "060104", "ddp-2dev", "--runs-dir", str(runs), "--json"]) == 0
    out = capsys.readouterr().out
    assert IDS[0] in out and IDS[2] in out
    assert cli.main(["compare", "quickstart", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ambiguous" in err and IDS[1] in err


def test_compare_sweep_and_sweep_resume_take_a_part(runs, capsys):
    assert cli.main(["compare", "--sweep", "quickstart-aaaa", "--runs-dir", str(runs),
                     "--json"]) == 0
    assert IDS[0] in capsys.readouterr().out
    assert cli.main(["compare", "--sweep", "2026112", "--runs-dir", str(runs)]) == 2
    assert "ambiguous" in capsys.readouterr().err
    # sweep --resume: the manifest is found by its part; its preset is then checked
    assert cli.main(["sweep", "--resume", "2026112", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ambiguous" in err


def test_resume_finds_a_run_by_a_part(runs, capsys):
    assert cli.main(["resume", "060104", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err  # found it: refused for what it is, not for its name
    assert err.count("\n") == 1 and "no checkpoint" in err and IDS[0] in err
    assert cli.main(["resume", "quickstart", "--runs-dir", str(runs)]) == 2
    assert "ambiguous" in capsys.readouterr().err


def test_a_sweep_id_given_for_a_run_points_to_the_sweep_commands(runs, capsys):
    """`gputui resume SWEEP_ID` said there is no such run, and nothing of `sweep --resume`."""
    sweep = "20261124-090000-tiny-bbbb"
    for argv in (["resume", sweep], ["resume", "tiny-bbbb"], ["compare", sweep]):
        assert cli.main([*argv, "--runs-dir", str(runs)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert (f"is a sweep, not a run: `gputui sweep --resume {sweep}` continues it, "
                f"`gputui compare --sweep {sweep}` compares its runs") in err, err
    assert cli.main(["resume", "nothing-like-it", "--runs-dir", str(runs)]) == 2
    assert "no run 'nothing-like-it'" in capsys.readouterr().err
