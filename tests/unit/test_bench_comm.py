"""`gputui bench-comm` on two CPU ranks (gloo) and the scratch allreduce, for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from gputui.cli.bench_comm import parse_size
from gputui.runs.comm_bench import bandwidths

GPUTUI = [sys.executable, "-m", "gputui"]


def gputui(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, *args], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def bench(cache_dir):
    return gputui("bench-comm", "--devices", "cpu*2", "--sizes", "4K,256K", "--iters", "3",
                  "--warmup", "1", "--repeats", "3", "--json",
                  env=dict(os.environ, GPUTUI_CACHE_DIR=str(cache_dir)))


@pytest.mark.slow
def test_two_cpu_ranks_report_a_bandwidth(bench):
    assert bench.returncode == 0, bench.stderr
    data = json.loads(bench.stdout)
    assert data["n"] == 2 and data["backend"] == "gloo" and data["devices"] == ["cpu:0", "cpu:1"]
    for impl in ("scratch", "torch"):
        rows = data[impl]
        assert [r["size"] for r in rows] == [4096, 262144]
        for r in rows:
            assert r["count"] == r["size"] // 4 and r["seconds"] > 0
            assert r["algbw_gbps"] == pytest.approx(r["size"] / r["seconds"] / 1e9)
            assert r["algbw_gbps"] > 0
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)
            assert r["time_us"] == pytest.approx(r["seconds"] * 1e6)
            # each size timed 3 times: the median, with the min, max and spread beside it
            assert r["repeats"] == 3 and sorted(r["samples"])[1] == r["seconds"]
            assert r["min_us"] <= r["time_us"] <= r["max_us"]
            assert r["spread"] == pytest.approx((r["max_us"] - r["min_us"]) / r["time_us"])
    assert {"others_share", "load_end", "contended", "when"} <= set(data["machine"])


@pytest.mark.slow
def test_the_peak_is_kept_for_this_machine(bench, cache_dir):
    """The highest torch algbw is kept per machine, for runs to show theirs against it."""
    from gputui.runs.predict.comm_peak import peak
    from gputui.runs.predict.cache import Cache

    best = max(r["algbw_gbps"] for r in json.loads(bench.stdout)["torch"])
    files = list(cache_dir.glob("predict-*.json"))
    assert len(files) == 1
    assert peak("cpu", 2, "gloo", Cache(files[0])) == pytest.approx(best)
    assert peak("cpu", 4, "gloo", Cache(files[0])) is None


@pytest.mark.slow
def test_no_process_outlives_the_benchmark(bench):
    leftovers = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:  # gone while we looked
            continue
        if p.ppid() == os.getpid() and "resource_tracker" in cmd:
            continue  # this pytest process's own tracker (earlier in-process launches)
        if "gputui" in cmd or "multiprocessing" in cmd:
            leftovers.append(cmd)
    assert leftovers == []


def test_busbw_formula():
    for n in (2, 4, 8):
        algbw, busbw = bandwidths(1_000_000, 0.001, n)
        assert algbw == pytest.approx(1.0) and busbw == pytest.approx(2 * (n - 1) / n)


def test_parse_size():
    assert [parse_size(s) for s in ("512", "4K", "4kb", "1M", "2G")] == \
        [512, 4096, 4096, 2**20, 2 * 2**30]
    with pytest.raises(ValueError, match="'4X' is not a size"):
        parse_size("4X")


@pytest.mark.parametrize("args, needle", [
    (["--sizes", "4Q"], "--sizes: '4Q' is not a size"),
    (["--devices", "cpu"], "needs at least 2 devices"),
    (["--devices", "cpu*x"], "--devices"),
    (["--impl", "mpi"], "--impl: 'mpi' is not known"),
    (["--iters", "0"], "--iters and --repeats must be at least 1"),
    (["--repeats", "0"], "--iters and --repeats must be at least 1"),
])
def test_bad_input_one_line_exit_2(args, needle, capsys):
    from gputui import cli

    assert cli.main(["bench-comm", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_table_layout(capsys):
    from gputui.cli.bench_comm import print_table
    from gputui.runs.comm_bench import with_bandwidths

    rows = with_bandwidths([{"size": 4096, "count": 1024, "seconds": 1e-5,
                             "samples": [1.2e-5, 1e-5, 0.9e-5]}], 2)
    print_table({"devices": ["cpu:0", "cpu:1"], "backend": "gloo", "torch": rows,
                 "machine": {"contended": True, "others_share": 0.5, "cores": 2,
                             "load_end": 3.0}})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# torch.distributed all_reduce (gloo")
    assert out[1].split()[1:] == ["size", "count", "type", "time", "min", "max", "spread",
                                  "algbw", "busbw"]
    assert out[3].split() == ["4096", "1024", "float", "10.0", "9.0", "12.0", "30%", "0.410",
                              "0.410"]
    assert "timed 3 times: the median" in out[5]
    assert out[6].startswith("# contended: other processes used 50% of the 2 cores")


def test_a_row_whose_repeats_spread_wide_is_called_noise(capsys):
    """A size whose repeats spread over half their median (142 % seen on a 4 KiB row here)
    gets a line saying its bandwidth is no steady figure, naming the widest; a steady one
    gets none."""
    from gputui.cli.bench_comm import print_table
    from gputui.runs.comm_bench import with_bandwidths

    steady = with_bandwidths([{"size": 4096, "count": 1024, "seconds": 1e-5,
                               "samples": [1.1e-5, 1e-5, 0.9e-5]}], 2)
    print_table({"devices": ["cpu:0", "cpu:1"], "backend": "gloo", "torch": steady})
    assert "noisy" not in capsys.readouterr().out
    wide = with_bandwidths([{"size": 65536, "count": 16384, "seconds": 1e-4,
                             "samples": [0.6e-4, 1e-4, 2.02e-4]}], 2)
    print_table({"devices": ["cpu:0", "cpu:1"], "backend": "gloo", "torch": steady + wide})
    noisy = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# noisy")]
    assert noisy == ["# noisy: 1 row(s) spread over 50% of their median (the widest 142%, "
                     "torch at 65536 B): their bandwidths are no steady figure; raise --iters "
                     "or --repeats, or measure on a quieter machine"], noisy
