"""The all-reduce bandwidth a run achieved against bench-comm's kept peak: what is kept, how
it is read back and shown, and how compare averages a record's figures (the real ddp figures
are checked against a known delay in test_equivalence_ddp.py)."""

from __future__ import annotations

import pytest

from gputui.core.events import StepMetrics
from gputui.runs.predict import comm_peak
from gputui.runs.compare.table import read_hw_figures
from gputui.runs.predict.cache import Cache


def _result(*algbw: float, n: int = 2, size: int = comm_peak.PEAK_MIN_BYTES) -> dict:
    return {"n": n, "backend": "gloo", "devices": [f"cpu:{i}" for i in range(n)],
            "torch": [{"size": size * (i + 1), "algbw_gbps": a, "busbw_gbps": a}
                      for i, a in enumerate(algbw)]}


def test_the_best_torch_figure_is_kept_and_only_a_better_one_replaces_it(tmp_path):
    cache = Cache(tmp_path / "predict.json")
    # calls of a few KiB take their latency: no peak of the link (none kept before)
    assert comm_peak.keep(_result(0.2, size=4096), "cpu", cache) is None
    assert comm_peak.peak("cpu", 2, "gloo", cache) is None
    size = comm_peak.PEAK_MIN_BYTES
    # nor one kept so before this rule (read as none, and replaced)
    cache.put(comm_peak.key("cpu", 2, "gloo"), {"algbw_gbps": 9.0, "size": 65536})
    assert comm_peak.peak("cpu", 2, "gloo", cache) is None
    assert comm_peak.keep(_result(0.3, 1.2, 0.8), "cpu", cache)["size"] == 2 * size
    assert comm_peak.peak("cpu", 2, "gloo", cache) == 1.2
    comm_peak.keep(_result(0.9), "cpu", cache)  # slower: the peak stays
    assert comm_peak.peak("cpu", 2, "gloo", Cache(tmp_path / "predict.json")) == 1.2
    comm_peak.keep(_result(2.0), "cpu", cache)
    assert comm_peak.peak("cpu", 2, "gloo", cache) == 2.0
    assert comm_peak.peak("cpu", 4, "gloo", cache) is None  # another device count
    busy, quiet = {"contended": True}, {"contended": False}
    comm_peak.keep(dict(_result(5.0), machine=busy), "cpu", cache)  # measured under load
    assert comm_peak.peak("cpu", 2, "gloo", cache) == 2.0
    comm_peak.keep(dict(_result(3.0, n=4), machine=busy), "cpu", cache)
    comm_peak.keep(dict(_result(1.0, n=4), machine=quiet), "cpu", cache)  # quiet wins
    assert comm_peak.peak("cpu", 4, "gloo", cache) == 1.0
    assert comm_peak.keep({"error": "boom", "n": 2}, "cpu", cache) is None
    assert comm_peak.text(0.5, 2.0) == "allreduce 0.50 GB/s, 25% of bench-comm's 2.00"
    assert comm_peak.text(0.5, None) == "allreduce 0.50 GB/s"
    # a kept peak below what a run achieved is not a peak: no share above 100 % is printed
    above = comm_peak.text(0.24, 0.0014)
    assert "%" not in above and "above bench-comm's kept peak 0.0014 GB/s" in above


def test_compare_averages_the_metered_steps_but_the_first():
    steps = [StepMetrics(epoch=1, step=s, global_step=s, steps_per_epoch=30, loss=1.0,
                         samples_per_s=100.0, step_time_s=0.1, lr=0.1, comm_gbps=g)
             for s, g in ((10, 0.01), (20, 0.4), (30, 0.6))]
    assert read_hw_figures("", steps)["comm_gbps"] == pytest.approx(0.5)
    assert read_hw_figures("", steps[:1])["comm_gbps"] == pytest.approx(0.01)
    assert read_hw_figures("", [])["comm_gbps"] is None


def test_compare_shows_the_bandwidth_beside_the_kept_peak(tmp_path, monkeypatch):
    import dataclasses
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from run_records import write_record

    from gputui.core.runstore import read_events
    from gputui.runs.compare.table import compare, summary_lines, table_rows

    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    run = write_record(tmp_path / "runs", "ddp2", strategy="ddp", n=2, epochs=3)
    lines = []
    for ev in read_events(run):  # the record's steps as a ddp run writes them
        if ev.kind == "step":
            ev = dataclasses.replace(ev, comm_gbps=0.3 if ev.epoch == 1 else 0.6)
        lines.append(ev.to_json())
    (run / "events.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (item,) = compare([run], tmp_path / "runs")
    assert item.comm_gbps == pytest.approx(0.6) and item.comm_peak_gbps is None
    assert table_rows([item])[0]["comm_gbps"] == pytest.approx(0.6)
    assert any("allreduce 0.60 GB/s (its gradient" in line and "no bench-comm peak" in line
               for line in summary_lines([item]))
    comm_peak.keep(_result(1.2), "cpu")
    (item,) = compare([run], tmp_path / "runs")
    assert item.comm_peak_gbps == 1.2
    assert any("allreduce 0.60 GB/s, 50% of bench-comm's 1.20" in line
               for line in summary_lines([item]))


@pytest.mark.parametrize("strategy,what", [
    ("ddp", "its gradient all-reduce"),
    ("tp", "its tensor-parallel activation all-reduces, 4 a block"),
])
def test_compare_names_the_collective_the_bandwidth_timed(tmp_path, monkeypatch, strategy,
                                                          what):
    """tp's bytes are its activation all-reduces: compare called them "its gradient
    all-reduce"."""
    import dataclasses
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from run_records import write_record

    from gputui.core.runstore import read_events
    from gputui.runs.compare.table import compare, summary_lines

    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))
    run = write_record(tmp_path / "runs", f"{strategy}2", strategy=strategy, n=2, epochs=2)
    lines = [(dataclasses.replace(ev, comm_gbps=0.5) if ev.kind == "step" else ev).to_json()
             for ev in read_events(run)]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (item,) = compare([run], tmp_path / "runs")
    (line,) = [x for x in summary_lines([item]) if "GB/s" in x]
    assert f"allreduce 0.50 GB/s ({what}, mean of the metered steps)" in line, line
