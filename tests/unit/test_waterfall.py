"""The scaling waterfall's arithmetic (gputui.runs.compare.waterfall: the bars add up to the measured
speedup, a negative remainder shown as it is), the straggler's attribution from ranks' rows
(gputui.core.straggler), and both through compare, its --waterfall, --json and PNG. The
injected-delay cases on real ranks are in test_equivalence_ddp.py (one shared launch)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from gputui import cli
from gputui.core import straggler
from gputui.core.breakdown import make
from gputui.core.events import DeviceStep
from gputui.runs.compare import waterfall
from gputui.runs.compare.table import compare, summary_lines
from run_records import write_record


def _sum(wf: waterfall.Waterfall) -> float:
    return wf.ideal - sum(lost for _, lost in wf.bars)


def test_bars_add_up_to_the_measured_speedup_and_each_cause_is_its_share():
    run = waterfall.Shares(comm=0.2, straggler=0.1, data=0.05, host=0.05, contention=0.0)
    base = waterfall.Shares(data=0.02, host=0.05)
    wf = waterfall.build(4.0, 2.2, run, base)
    assert _sum(wf) == pytest.approx(2.2)
    assert [c for c, _ in wf.bars] == [*waterfall.CAUSES, "unexplained"]
    assert wf.lost("comm") == pytest.approx(4 * 0.2)
    assert wf.lost("straggler") == pytest.approx(4 * 0.1)
    # the run's share beyond what perfect scaling of the baseline's share would keep
    assert wf.lost("data") == pytest.approx(4 * 0.05 - 2.2 * 0.02)
    assert wf.lost("host") == pytest.approx(4 * 0.05 - 2.2 * 0.05)
    assert wf.lost("unexplained") == pytest.approx(4 - 2.2 - 0.8 - 0.4 - 0.156 - 0.09)


def test_a_run_whose_causes_explain_more_than_it_lost_shows_a_negative_remainder():
    wf = waterfall.build(2.0, 1.9, waterfall.Shares(comm=0.3))  # 0.6x claimed, 0.1x lost
    assert wf.lost("unexplained") == pytest.approx(-0.5)
    assert _sum(wf) == pytest.approx(1.9)
    text = "\n".join(waterfall.lines(wf))
    assert "unexplained" in text and "+0.50x" in text and "-0.60x" in text
    # a perfect run: nothing lost, every bar 0 and the remainder 0
    perfect = waterfall.build(2.0, 2.0, waterfall.Shares())
    assert all(v == pytest.approx(0.0) for _, v in perfect.bars)


def test_shares_take_the_straggler_wait_out_of_exposed_comm_and_name_the_wait_part():
    bd = make(span_s=0.1, data_s=0.0, compute_s=0.05, optimizer_s=0.01, comm_exposed_s=0.03,
              wait_s=0.01)  # host 0.0
    slow = straggler.Straggler(rank=1, device="cpu:1", phase="backward", lag_s=0.02,
                               wait_s=0.02, step_s=0.1, ranks=2)  # spread: 0.01 a rank
    s = waterfall.shares(bd, slow, pipeline=False, contention=0.25)
    assert s.straggler == pytest.approx(0.1) and s.comm == pytest.approx(0.2)
    assert s.turns == pytest.approx(0.1) and s.bubble == 0.0 and s.contention == 0.25
    # pp: the wait part is its bubble. Equal stages, free sends: the theory's (p-1)/(m+p-1)
    # of the pipeline is idle, and the bubble's bar is N times that share of the step
    p, m, pipeline = 2, 4, 0.08
    bubble = (p - 1) / (m + p - 1) * pipeline
    stage = make(span_s=0.1, data_s=0.0, compute_s=pipeline - bubble, optimizer_s=0.02,
                 comm_exposed_s=0.0, wait_s=bubble)
    pp = waterfall.shares(stage, None, pipeline=True)
    assert pp.bubble == pytest.approx(0.2 * 0.08 / stage.step_s) and pp.turns == 0.0
    wf = waterfall.build(2.0, 1.4, pp, waterfall.Shares())
    assert wf.lost("bubble") == pytest.approx(2.0 * bubble / stage.step_s)
    assert _sum(wf) == pytest.approx(1.4)


def _rank(rank: int, forward: float, backward: float, exposed: float, step: float = 0.3):
    bd = make(span_s=step, data_s=0.001, compute_s=forward + backward, optimizer_s=0.01,
              comm_exposed_s=exposed)
    return DeviceStep(f"cpu:{rank}", rank=rank, breakdown=bd, forward_s=forward,
                      backward_s=backward)


def test_the_straggler_is_the_rank_slowest_in_its_own_work_and_the_others_wait_for_it():
    rows = [_rank(0, 0.02, 0.05, 0.21), _rank(1, 0.02, 0.25, 0.01), _rank(2, 0.021, 0.05, 0.2)]
    s = straggler.find(rows)
    assert s is not None and (s.rank, s.phase) == (1, "backward")
    assert s.lag_s == pytest.approx(0.2, abs=0.002) and s.wait_s == pytest.approx(0.195)
    assert s.significant() and s.mean_wait_s == pytest.approx(0.195 * 2 / 3)
    assert straggler.line(s).startswith("straggler: rank 1 (cpu:1), in backward: +")
    even = straggler.find([_rank(0, 0.02, 0.0501, 0.01), _rank(1, 0.02, 0.05, 0.01)])
    assert even is not None and not even.significant()
    assert straggler.line(even).startswith("ranks even")
    # rows without phases (single, scratch, an older record): no straggler
    assert straggler.find([DeviceStep("cpu:0"), DeviceStep("cpu:1")]) is None
    run = straggler.over_steps([s, s, even, s])  # the first, warm-up, left out
    assert run is not None and run.rank == 1 and run.steps == 3
    assert run.agree == pytest.approx(2 / 3)


def _records(tmp_path):
    base = tmp_path / "runs"
    one = make(span_s=0.1, data_s=0.01, compute_s=0.08, optimizer_s=0.01,
               comm_exposed_s=None)  # host 0.01, the step 0.11 (data is in it)
    two = make(span_s=0.1, data_s=0.01, compute_s=0.05, optimizer_s=0.01,
               comm_exposed_s=0.03, comm_overlap_s=0.01)  # host 0.01
    write_record(base, "20260101-100000-exp-base", "single", 1, batch=256, sps=1000,
                 windows=2, epochs=3, breakdowns=[one] * 3)
    run = write_record(base, "20260101-110000-exp-ddp2", "ddp", 2, batch=256, scale=True,
                       sps=1500, windows=2, epochs=3, breakdowns=[two] * 3)
    return base, run


def test_compare_gives_each_run_its_waterfall_in_json_text_and_png(tmp_path, capsys):
    base, run = _records(tmp_path)
    (item,) = compare([run], base)
    wf = item.waterfall
    assert wf is not None and item.speedup == pytest.approx(1.5)
    assert wf.ideal == 2 and _sum(wf) == pytest.approx(1.5)
    assert wf.lost("comm") == pytest.approx(2 * 0.03 / 0.11)
    assert wf.lost("data") == pytest.approx(2 * 0.01 / 0.11 - 1.5 * 0.01 / 0.11)
    assert cli.main(["compare", "ddp2", "--runs-dir", str(base), "--waterfall"]) == 0
    out = capsys.readouterr().out
    assert "scaling waterfall" in out and "exposed communication" in out
    assert "-0.55x" in out and "measured" in out and "1.50x" in out
    assert cli.main(["compare", "ddp2", "--runs-dir", str(base), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)[0]["waterfall"]
    assert data["ideal"] == 2 and data["measured"] == pytest.approx(1.5)
    assert data["ideal"] - sum(b["lost"] for b in data["bars"]) == pytest.approx(1.5)
    assert not any("straggler" in ln for ln in summary_lines([item]))  # no per-rank rows
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: the PNG is not drawn")
    assert cli.main(["compare", "ddp2", "--runs-dir", str(base), "--plots",
                     str(tmp_path / "png")]) == 0
    png = (tmp_path / "png" / "waterfall.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_a_run_without_a_baseline_says_why_it_has_no_waterfall(tmp_path, capsys):
    base, _ = _records(tmp_path)
    shutil.rmtree(base / "20260101-100000-exp-base")
    assert cli.main(["compare", "ddp2", "--runs-dir", str(base), "--waterfall"]) == 0
    assert "no waterfall (no speedup)" in capsys.readouterr().out


def test_the_communication_bar_says_which_collectives_it_was():
    """A run whose steps named their collectives: the waterfall's communication bar is followed
    by what it was made of, each kind's share of the named time."""
    from dataclasses import replace

    from gputui.runs.compare.waterfall import Shares, build, lines

    wf = build(2.0, 1.2, Shares(comm=0.3), Shares())
    assert not any("of which" in line for line in lines(wf))
    wf = replace(wf, comm_kinds={"tp all-reduce": 0.003, "fsdp all-gather": 0.001})
    text = lines(wf)
    at = next(i for i, line in enumerate(text) if "exposed communication" in line)
    assert text[at + 1].strip() == "of which tp all-reduce 75% · fsdp all-gather 25%"
    assert wf.to_dict()["comm_kinds"] == {"tp all-reduce": 0.003, "fsdp all-gather": 0.001}
