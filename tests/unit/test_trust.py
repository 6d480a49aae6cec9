"""Figures you can trust on a busy machine (issue 24): the machine's state, noisy and impossible
speedups, baselines measured the same way, no speed for a run that has none, kept inputs
named with their age."""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from gputui.core import machine
from gputui.hw import contention
from gputui.runs.compare.cells import cell, fmt
from gputui.runs.compare.table import TABLE_COLUMNS, as_plain, compare, summary_lines, table_rows
from gputui.runs.history import row_for
from run_records import write_record

QUIET = {"contended": False, "others_share": 0.01, "cores": 2, "load_end": 0.1}
BUSY = {"contended": True, "others_share": 0.5, "cores": 2, "load_end": 3.2}


def _machine(run_dir, state):
    (run_dir / machine.FILE).write_text(json.dumps(state))
    return run_dir


def _orphan_spinner() -> int:
    """A process spinning on one core that is not this test's child (another user's job):
    started through a shell that exits at once, so init adopts it. An earlier test of this
    process may have made it a subreaper (proctree.adopt_orphans, as the launcher does), which
    would adopt the spinner as its own: that is switched off while the shell exits."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    was = ctypes.c_int(0)
    if prctl is not None:
        prctl(37, ctypes.byref(was), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off
    try:
        out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' "
                                          f">/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, timeout=30)
    finally:
        if prctl is not None and was.value:
            prctl(36, 1, 0, 0, 0)
    pid = int(out.stdout.strip())
    assert psutil.Process(pid).ppid() != os.getpid(), "the spinner was adopted by this test"
    return pid


def test_a_busy_core_is_seen_as_contention_and_our_own_children_are_not_others():
    # enough spinners to hold twice the contention threshold on this machine's cores, each
    # watched until it has really run (no assumption on how soon a process gets a core)
    n = max(1, math.ceil(2 * machine.CONTENDED * (psutil.cpu_count() or 1)))
    watch = contention.LoadWatch()
    pids = [_orphan_spinner() for _ in range(n)]
    try:
        procs = [psutil.Process(pid) for pid in pids]
        start = [p.cpu_times() for p in procs]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.2)
            used = [sum(p.cpu_times()[:2]) - sum(s0[:2]) for p, s0 in zip(procs, start)]
            if min(used) >= 0.5:
                break
        state = watch.state()
        spun = sum(sum(p.cpu_times()[:2]) for p in procs)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    assert min(used) >= 0.5, "the spinners never got a core in 120 s"
    # every CPU second the spinners used is counted as another's (rounding aside)
    others_s = state["others_share"] * state["seconds"] * state["cores"]
    assert others_s >= 0.9 * spun - 0.01 * state["seconds"] * state["cores"], (others_s, spun)
    if spun / (state["seconds"] * state["cores"]) >= machine.CONTENDED:
        assert state["contended"] and state["others_share"] >= machine.CONTENDED
        assert state["note"].startswith("contended: other processes used")
    assert {"when", "host", "load_start", "load_end", "gpu_others"} <= set(state)
    # a child of ours spinning counts as our own CPU time, not as another's
    own0 = contention._tree_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\n"
                              "while time.time()-t<1.0: pass"])
    child.wait(timeout=60)
    assert contention._tree_cpu_s() - own0 >= 0.05


def _noisy_runs(tmp_path):
    runs = tmp_path / "runs"
    # the sweep: one slow single-device run, then runs 6-11x faster than it
    base = write_record(runs, "20260101-100300-exp-base", "ddp", 1, batch=64, sps=100,
                        epochs=4)
    s1 = write_record(runs, "20260101-100100-exp-s1", "scratch", 1, batch=64, sps=609,
                      epochs=4)
    d2 = write_record(runs, "20260101-100200-exp-d2", "ddp", 2, batch=64, sps=1094, epochs=4)
    return runs, base, s1, d2


def _efficiencies(items):
    return [cell("efficiency", r) for r in table_rows(items)]


def test_an_injected_slow_baseline_never_prints_an_efficiency_above_100(tmp_path):
    runs, base, s1, d2 = _noisy_runs(tmp_path)
    items = compare([base, s1, d2], runs, only_compared=True)
    for text in _efficiencies(items):
        m = re.match(r"([\d.]+)%", text)
        assert m is None or float(m.group(1)) <= 100, text
    by = {it.row.id[-2:]: it for it in items}
    assert by["s1"].flags and "efficiency 609% exceeds 100 %" in by["s1"].flags[0]
    assert table_rows([by["s1"]])[0]["check"] == "FLAGGED"
    assert cell("speedup", table_rows([by["se"]])[0]) == "1.00x ±0.04"  # its noise beside it
    assert table_rows(items)[0]["baseline"] == base.name  # the table names the baseline
    assert as_plain(items)[0]["speedup_noise"] == pytest.approx(0.04)  # and the JSON its noise


def test_a_busy_machine_shows_noisy_and_contended_and_refuses_a_quiet_baseline(tmp_path):
    runs, base, s1, d2 = _noisy_runs(tmp_path)
    for d in (base, s1, d2):
        _machine(d, BUSY)
    items = compare([base, d2], runs, only_compared=True)
    d = items[1]
    assert d.noisy and "contended" in d.noisy[0] and d.speedup is not None
    row = table_rows([d])[0]
    assert row["speedup"] == "flagged"  # 547 % efficiency: impossible, whatever the noise
    items = compare([base, s1], runs, only_compared=True)
    assert table_rows(items)[1]["efficiency"] == "flagged"
    # a speedup below 100 % under contention: shown as noisy, never as a result
    slow = write_record(runs, "20260101-100400-exp-slow", "ddp", 2, batch=64, sps=150,
                        epochs=4)
    _machine(slow, BUSY)
    (_, it) = compare([base, slow], runs, only_compared=True)
    assert table_rows([it])[0]["speedup"] == "noisy" and table_rows([it])[0]["check"] == "NOISY"
    assert any(line.startswith(f"{slow.name}: NOISY") and "other processes used 50%" in line
               for line in summary_lines([it]))
    # a quiet run's baseline must be quiet too: another machine state is refused
    _machine(slow, QUIET)
    (_, it) = compare([base, slow], runs, only_compared=True)
    assert it.speedup is None and "another machine state" in it.refused[0]


def test_baselines_only_from_the_same_sweep_and_measured_the_same_way(tmp_path):
    runs = tmp_path / "runs"
    other = write_record(runs, "20260101-090000-exp-other", "single", 1, batch=64, sps=50,
                         epochs=4)
    short = write_record(runs, "20260101-100000-exp-short", "single", 1, batch=64, sps=500,
                         epochs=1)
    run = write_record(runs, "20260101-100100-exp-d2", "ddp", 2, batch=64, sps=900, epochs=4)
    (item,) = compare([run], runs, only_compared=True)
    assert item.speedup is None  # the other sweep's run is not a baseline of this one
    _, it = compare([short, run], runs, only_compared=True)
    assert it.speedup is None and "no steady-state steps" in it.refused[0]
    _, it = compare([other, run], runs, only_compared=True)
    assert it.baseline == other.name
    assert not any("both from steady-state" in line and "warm-up included" in line
                   for line in summary_lines([it]))


def test_a_stopped_point_shows_no_speed_anywhere(tmp_path):
    runs = tmp_path / "runs"
    base = write_record(runs, "20260101-100000-exp-base", "single", 1, batch=64, sps=1000,
                        epochs=4)
    stopped = write_record(runs, "20260101-100100-exp-stop", "scratch", 1, batch=64,
                           sps=200, epochs=4, status="stopped")
    row = row_for(stopped)
    assert row.samples_per_s is None and row.time_per_epoch_s is None  # history, the app
    items = compare([base, stopped], runs, only_compared=True)
    cells = table_rows(items)[1]
    for key in ("time_per_epoch_s", "samples_per_s", "speedup", "efficiency"):
        assert fmt(key, cells[key]) == "-", key
    plain = as_plain(items)[1]
    assert plain["speedup"] is None and plain["samples_per_s"] is None  # the exports
    (note,) = [ln for ln in summary_lines(items) if ln.startswith(stopped.name)]
    assert note == f"{stopped.name}: no speed figures (stopped: stopped by user)"
    assert set(TABLE_COLUMNS) <= set(cells)


def test_kept_prediction_inputs_say_when_and_under_what_load():
    from gputui.cli.predict import source_lines
    from gputui.runs.predict.cache import ComputeKey
    from gputui.runs.predict.inputs import stale

    kept = {"step_time_s": 0.05, "measured": "2026-01-01 10:00:00",
            "measured_t": time.time() - 7200, "machine": QUIET,
            "omp_wait": "passive (OMP_WAIT_POLICY set by the user)"}  # as the suite's runs
    assert stale(kept) is None
    assert "other processes" in stale(dict(kept, machine=BUSY))
    assert "without when" in stale({"step_time_s": 0.052, "measured": "2025-12-01"})
    key = ComputeKey("lenet", "mnist", "fp32", "off", False, 64, 1, 2, 1, "cpu")
    assert str(key) == "compute|lenet|mnist|fp32|off|False|b64|t2|x1|cpu"
    lines = source_lines([
        {"input": key.name(), "source": "cached", "measured": "2026-01-01 10:00:00",
         "age_s": 7200.0, "note": ""},
        {"input": "allreduce of 0.25 MiB over 2 devices", "source": "measured now",
         "measured": "", "age_s": 0.0, "note": machine.note(BUSY)}])
    assert lines[0] == ("  compute single, batch 64, 2 threads, 1 copy on cpu: cached, "
                        "measured 2026-01-01 10:00:00 (2.0 h old)")
    assert lines[1].startswith("  allreduce of 0.25 MiB over 2 devices: measured now; "
                               "contended: other processes used 50% of the 2 cores")
    assert "different moments" in lines[2]


def test_a_kept_inputs_name_is_its_keys_not_parsed_back_from_the_string():
    """Model, data and fsdp labels may hold the key's separator: an fsdp label holds the data
    label, and a file path may hold ``|``. The key is a dataclass whose fields name the input
    (it printed "collectives over ystdlib devices" when the string was split by position),
    and the string kept on disk is the one kept files hold."""
    from gputui.core.config import RunConfig
    from gputui.runs.predict.cache import CommKey, ComputeKey, compute_key

    fsdp = CommKey("cpu", 2, 0, "fsdp:gpt|text:/usr/lib/python3.11/stdlib.txt|Block|step"
                                ":gap5.2ms")
    assert fsdp.name() == "fsdp collectives over 2 devices"
    assert str(fsdp) == ("comm|cpu:fsdp:gpt|text:/usr/lib/python3.11/stdlib.txt|Block|"
                         "step:gap5.2ms|n2|0")
    ring = CommKey("gpu", 4, 3 * 2**20, "NVIDIA H100 | 80GB:gap5ms")
    assert ring.name() == "allreduce of 3.00 MiB over 4 devices"
    assert str(ring) == "comm|gpu:NVIDIA H100 | 80GB:gap5ms|n4|3145728"
    compute = ComputeKey("file:/tmp/a|b/model.py:make", "text:/tmp/c|d.txt", "fp32", "off",
                         False, 64, 4, 1, 2, "cpu", "ddp")
    assert compute.name() == "compute ddp, batch 64 in 4 micro-batches, 1 thread, 2 copies on cpu"
    assert str(compute) == ("compute|file:/tmp/a|b/model.py:make|text:/tmp/c|d.txt|fp32|off|"
                            "False|b64/4|t1|x2|cpu|ddp@1")
    key = compute_key(RunConfig(), 64, 2, 1, "cpu")
    assert str(key) == "compute|lenet|synthetic|fp32|off|False|b64|t2|x1|cpu"
    assert key.name() == "compute single, batch 64, 2 threads, 1 copy on cpu"


def test_other_processes_on_the_gpu_make_a_run_contended_through_nvml():
    from fakes.nvml import FakeGpu, FakeNvml

    from gputui.core.devices import Device
    from gputui.hw import nvml

    gpu = FakeGpu(uuid="GPU-1111", util=87, processes=[(os.getpid(), 2**30), (424242, 2**31)])
    nvml.use_module(FakeNvml([gpu]))
    try:
        uuids = contention.gpu_uuids([Device("cuda", 0), Device("cpu", 0)])
        assert uuids == ("GPU-1111",)
        state = contention.LoadWatch(uuids).state()
    finally:
        nvml.use_module(None)
    # this process is ours; pid 424242 is another user's job on the same GPU
    assert [o["pid"] for o in state["gpu_others"]] == [424242] and state["gpu_util"] == [87.0]
    assert state["contended"] and "other processes on the GPU: pid 424242" in state["note"]


def test_an_impossible_efficiency_in_one_sweep_is_not_told_to_measure_in_one_sweep(tmp_path):
    """A sweep's runs were measured back to back already: its flag names what slowed the
    baseline as it ran and asks for a quiet machine and --repeat; runs measured apart are told
    to measure both in one sweep."""
    runs, base, s1, d2 = _noisy_runs(tmp_path)
    swept = {it.row.id: it for it in compare([base, d2], runs, only_compared=True)}
    (why,) = swept[d2.name].flags
    assert "both ran in one sweep" in why and "--repeat 3" in why
    assert "measure both in one sweep" not in why
    apart = {it.row.id: it for it in compare([d2], runs)}
    assert apart[d2.name].flags[0].endswith("measure both in one sweep")


def test_a_poisoned_baseline_is_said_in_plain_words_with_the_remedy():
    from gputui.core.trust import poisoned

    steady = {"noise": 0.05, "threads": 2}
    assert poisoned(QUIET, **steady) == ""
    assert poisoned(None, **steady) == ""  # no machine state recorded, steady steps
    busy = poisoned(BUSY, **steady, omp_wait="passive (gputui's default)")
    assert busy.startswith("its speed is not a baseline: other processes used 50% of the 2 "
                           "cores while it ran (load 3.2)")
    assert "rerun it on a quiet machine" in busy and "spin" not in busy
    spun = poisoned(BUSY, **steady, omp_wait="active (OMP_WAIT_POLICY set by the user)")
    assert "its 2 threads spin while they wait" in spun and "PASSIVE" in spun
    unsteady = poisoned(QUIET, noise=0.35, threads=2)
    assert "its steady steps varied ±35% (above 20%)" in unsteady


def test_the_run_summary_prints_the_warning():
    import io

    from gputui.cli.printer import Printer
    from gputui.core.runstore import RunSummary

    out = io.StringIO()
    Printer(stream=out, live=False).summary(
        RunSummary.from_dict({"status": "finished", "run_id": "r"}),
        baseline_warning="its speed is not a baseline: x")
    assert "warning: its speed is not a baseline: x" in out.getvalue()
