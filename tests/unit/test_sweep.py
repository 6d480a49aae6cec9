"""A real sweep on CPU (single, scratch and ddp over 1 and 2 devices) through `gputui sweep`,
its table, exports and manifest; resume after a real Ctrl-C and after a saved manifest."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputui.core import registry
from gputui.core.runstore import read_events
from gputui.runs.sweep.runner import Manifest, Point, load_manifest

GPUTUI = [sys.executable, "-m", "gputui"]
pytestmark = pytest.mark.slow

TINY = """
[run]
name = "tiny"
epochs = 1
log_every = 2
[model]
name = "lenet"
init = "default"
[data]
name = "synthetic"
train_size = 1024
test_size = 256
[optim]
batch_size = 128
lr = 0.1
[devices]
spec = "cpu"
[telemetry]
enabled = false
"""


def gputui(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUTUI, *args], capture_output=True, text=True, timeout=400, **kw)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("preset") / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def sweep(tiny, tmp_path_factory):
    """One real sweep shared by the tests: 1 and 2 CPU devices x single, scratch, ddp."""
    runs = tmp_path_factory.mktemp("runs")
    out = tmp_path_factory.mktemp("export")
    proc = gputui("sweep", str(tiny), "--devices", "1,2", "--strategies", "single,scratch,ddp",
                  "--runs-dir", str(runs), "--json", "--export", str(out))
    return proc, runs, out


def test_sweep_runs_the_grid_and_prints_the_table(sweep):
    proc, runs, _ = sweep
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    points = {p["strategy"] + "@" + p["devices"]: p for p in data["sweep"]["points"]}
    assert list(points) == ["single@1", "scratch@1", "ddp@1", "single@2", "scratch@2", "ddp@2"]
    assert points["single@2"]["status"] == "skipped"
    assert "uses 1 device" in points["single@2"]["reason"]
    for key in ("single@1", "scratch@1", "scratch@2"):
        assert points[key]["status"] == "finished"
    if registry.get("ddp") is None:  # not built yet: listed as skipped, with the reason
        assert points["ddp@2"]["status"] == "skipped" and "'ddp'" in points["ddp@2"]["reason"]
    else:
        assert points["ddp@2"]["status"] == "finished", points["ddp@2"]
    rows = {(r["strategy"], r["devices"]): r for r in data["runs"]}
    single, scratch2 = rows[("single", 1)], rows[("scratch", 2)]
    for r in rows.values():  # plausible numbers from real runs
        assert r["status"] == "finished" and r["samples_per_s"] > 0 and r["batch"] == 128
        assert 0 < r["time_per_epoch_s"] < 120 and 0.0 <= r["test_acc"] <= 1.0
        assert r["init_s"] > 0
        # 8 steps are all warm-up (gputui.core.steady): no run is a baseline, no speedup is
        # shown, and the refusal says why (issue 24)
        assert r["speedup"] is None and r["efficiency"] is None and r["baseline"] == ""
        assert any("no steady-state steps" in why for why in r["refused"])
        assert len(r["loss_curve"]) == 4 and len(r["acc_curve"]) == 1  # 8 steps, logged every 2
    assert single["comm_share"] is None
    assert 0.0 <= scratch2["comm_share"] <= 1.0
    assert "skipped single@2" in proc.stderr and "[1/6] single on cpu: finished" in proc.stderr


def test_every_point_is_recorded_with_a_manifest(sweep):
    proc, runs, _ = sweep
    data = json.loads(proc.stdout)
    manifest = load_manifest(runs, data["sweep"]["sweep_id"])
    assert manifest.state == "finished"
    ran = [p.run_id for p in manifest.points if p.status == "finished"]
    assert all((runs / rid / "summary.json").exists() for rid in ran)
    listed = json.loads(gputui("runs", "--runs-dir", str(runs), "--json").stdout)
    assert {r["id"] for r in listed} == set(ran)


def test_sweep_exports_parse_back(sweep):
    proc, _, out = sweep
    n = len(json.loads(proc.stdout)["runs"])
    rows = list(csv.DictReader((out / "scaling.csv").open()))
    # 8 steps are all warm-up (gputui.core.steady): no speedup at all, not a flagged one
    assert len(rows) == n and rows[0]["speedup"] == "" and rows[0]["check"] == ""
    assert len(json.loads((out / "scaling.json").read_text())) == n
    md = (out / "scaling.md").read_text().splitlines()
    assert len(md) == n + 2 and len({ln.count("|") for ln in md}) == 1
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed, so no PNG was written")
    for name in ("curves.png", "speedup.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _manifest_file(runs: Path) -> Path | None:
    files = list((runs / "sweeps").glob("*.json")) if (runs / "sweeps").is_dir() else []
    return files[0] if files else None


def test_ctrl_c_then_resume_does_not_redo_finished_points(tiny, tmp_path):
    runs = tmp_path / "runs"
    args = ["sweep", str(tiny), "--devices", "1", "--strategies", "single,scratch",
            "--runs-dir", str(runs)]
    proc = subprocess.Popen([*GPUTUI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:  # interrupt while the second point runs
        path = _manifest_file(runs)
        points = json.loads(path.read_text())["points"] if path else []
        if len(points) == 2 and points[1]["status"] == "running":
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    sweep_id = _manifest_file(runs).stem
    assert f"gputui sweep --resume {sweep_id}" in out
    first = load_manifest(runs, sweep_id)
    assert first.state == "interrupted"
    assert [p.status for p in first.points] == ["finished", "stopped"]
    # the same command again resumes automatically and runs only the unfinished point
    again = gputui(*args)
    assert again.returncode == 0, again.stderr
    assert f"resuming unfinished sweep {sweep_id} (1 of 2 points done" in again.stdout
    second = load_manifest(runs, sweep_id)
    assert second.state == "finished" and [p.status for p in second.points] == ["finished"] * 2
    assert second.points[0].run_id == first.points[0].run_id  # not run again
    assert second.points[1].run_id != first.points[1].run_id
    stopped = json.loads((runs / first.points[1].run_id / "summary.json").read_text())
    assert stopped["status"] == "stopped"  # the interrupted run kept its record
    assert len([p for p in runs.iterdir() if (p / "events.jsonl").exists()]) == 3


def test_resume_by_id_skips_finished_points(sweep, tiny, tmp_path):
    _, old_runs, _ = sweep
    data_runs = tmp_path / "runs"
    done = next(p for p in load_manifest(old_runs, _manifest_file(old_runs).stem).points
                if p.key == "single@1")
    shutil.copytree(old_runs / done.run_id, data_runs / done.run_id)
    m = Manifest("20260101-000000-tiny-abcd", str(tiny), [], ["1", "2"], ["single"],
                 state="interrupted",
                 points=[Point("single", "1", "cpu", "finished", done.run_id),
                         Point("single", "2", "cpu*2")])
    m.save(data_runs)
    proc = gputui("sweep", "--resume", m.sweep_id, "--runs-dir", str(data_runs))
    assert proc.returncode == 0, proc.stderr
    after = load_manifest(data_runs, m.sweep_id)
    assert [p.status for p in after.points] == ["finished", "skipped"]
    assert after.points[0].run_id == done.run_id
    assert [p.name for p in data_runs.iterdir() if p.name != "sweeps"] == [done.run_id]
    # the table still shows the earlier run (by its id past the date: a unique part of it)
    assert done.run_id.split("-", 2)[2] in proc.stdout


def test_sweep_bad_input_exits_2(tiny, tmp_path):
    for args, needle in ((["--devices", "1,x"], "'x' is not a device count"),
                         (["--set", "optim.lr=-1"], "optim.lr must be greater than 0.0"),
                         (["--strategies", ","], "at least one strategy"),
                         (["--strategies", "single,sclatch"],
                          "--strategies: unknown strategy 'sclatch'; known: single, scratch")):
        proc = gputui("sweep", str(tiny), "--runs-dir", str(tmp_path), *args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = gputui("sweep", "--resume", "nope", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and "no sweep 'nope'" in proc.stderr


def test_fast_path_axes_multiply_the_grid_and_show_in_the_table(tiny, tmp_path):
    runs = tmp_path / "runs"
    proc = gputui("sweep", str(tiny), "--devices", "1", "--strategies", "single",
                  "--precisions", "fp32,bf16", "--channels-last", "off,on", "--runs-dir",
                  str(runs), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [p["settings"] for p in data["sweep"]["points"]] == [
        {"run.precision": "fp32", "run.channels_last": False},
        {"run.precision": "fp32", "run.channels_last": True},
        {"run.precision": "bf16", "run.channels_last": False},
        {"run.precision": "bf16", "run.channels_last": True}]
    assert all(p["status"] == "finished" for p in data["sweep"]["points"])
    fast = {r["fast"]: r for r in data["runs"]}  # each run's config says what it ran
    assert set(fast) == {"fp32", "fp32 channels_last", "bf16", "bf16 channels_last"}
    # a channels_last run is measured against the eager, default-format run of its precision
    for name, base in (("fp32 channels_last", "fp32"), ("bf16 channels_last", "bf16")):
        row, ref = fast[name], fast[base]
        # a run of too few steps for a steady state, or measured in another machine state,
        # is no baseline (issue 24's rules): then the row shows no speedup at all
        assert row["baseline"] in (ref["id"], ""), (row, ref)
        if not row["baseline"]:
            assert row.get("speedup") is None, row
    # the points ran in one warm worker: only the first paid for torch's import
    imports = [next(e for e in read_events(runs / p["run_id"]) if e.kind == "init_done").import_s
               for p in data["sweep"]["points"]]
    assert all(s < 0.2 for s in imports[1:]), imports


@pytest.mark.parametrize("option,value,expected", [
    ("--compile", "off,fast", "--compile off,fast: 'fast' is not one of off, default, "
                              "reduce-overhead, max-autotune"),
    ("--precisions", "fp64", "--precisions fp64: 'fp64' is not one of fp32, bf16, fp16"),
    ("--channels-last", "maybe", "--channels-last maybe: 'maybe' is not one of off, on"),
    ("--contexts", "256,big", "--contexts 256,big: 'big' is not a context length")])
def test_a_bad_fast_path_axis_is_one_line_and_exit_2(tiny, tmp_path, option, value, expected):
    proc = gputui("sweep", str(tiny), option, value, "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- the kind of device swept
@pytest.mark.parametrize("asked,preset_spec,n_gpus,kind,says", [
    ("auto", "2", 1, "gpu", "scaling over GPUs, as the preset names GPUs"),
    ("auto", "cpu*2", 1, "cpu", "this machine has 1 GPU: --kind gpu scales over them"),
    ("auto", "2", 0, "cpu", "scaling over CPU virtual devices"),
    ("gpu", "cpu*2", 2, "gpu", "scaling over GPUs (this machine has 2 GPUs)"),
    ("cpu", "0", 8, "cpu", "--kind gpu scales over them"),
])
def test_the_kind_of_device_a_sweep_scales_over(fake_gpus, asked, preset_spec, n_gpus, kind,
                                                says):
    from gputui.runs.sweep.runner import resolve_kind

    fake_gpus(n_gpus)
    got, line = resolve_kind(asked, preset_spec)
    assert got == kind and says in line


def test_gpu_points_never_fall_back_to_the_cpu(fake_gpus, tmp_path):
    from gputui.runs.sweep.runner import Sweep

    fake_gpus(1)
    preset = tmp_path / "p.toml"
    preset.write_text('[devices]\nspec = "1"\nfallback = "cpu"\n', encoding="utf-8")
    sweep = Sweep.new(str(preset), [], ["1", "2"], ["scratch"], False, tmp_path, [], "gpu")
    one, two = sweep.manifest.points
    assert (one.spec, two.spec) == ("1", "2")
    assert sweep.why_not(one, sweep.config_for(one)) is None
    # two GPUs asked of a one-GPU machine: skipped with the reason, not run on cpu*2
    assert "asks for 2 GPUs but this machine has only 1" in sweep.why_not(
        two, sweep.config_for(two))
    cpu = Sweep.new(str(preset), [], ["1", "2"], ["scratch"], False, tmp_path, [], "cpu")
    assert [p.spec for p in cpu.manifest.points] == ["cpu", "cpu*2"]


def test_kind_gpu_without_a_gpu_is_refused_in_one_line(tmp_path):
    import os

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU visible, whatever the machine has
    proc = subprocess.run([*GPUTUI, "sweep", "quickstart", "--kind", "gpu", "--runs-dir",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gputui: error: --kind gpu: no GPU is available (")
    assert proc.stderr.strip().endswith("use --kind cpu") and proc.stderr.count("\n") == 1


def test_a_resumed_sweep_of_thousands_of_points_has_a_header_of_one_short_line(tiny, tmp_path):
    """A grid of 2,016 points printed every key on one 25 KB line."""
    runs = tmp_path / "runs"
    points = [Point("single", str(n), f"cpu*{n}", "finished", settings={"run.seed": s})
              for n in (1, 2) for s in range(1008)]
    m = Manifest("20260101-000000-tiny-beef", str(tiny), [], ["1", "2"], ["single"],
                 state="interrupted", points=points)
    m.save(runs)
    proc = gputui("sweep", "--resume", m.sweep_id, "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    (header,) = [line for line in proc.stdout.splitlines() if "2016 points" in line]
    assert len(header) < 400, header
    assert "... and 2,010 more" in header and f"manifest {runs}" in header


def test_the_context_length_is_an_axis_each_point_names(tmp_path):
    """`--contexts 64,128`: every strategy at each length (single against cp as the context
    grows), each point's run set to it; runs of other lengths are not its speed baseline."""
    from gputui.runs.compare.table import match_key
    from gputui.runs.history import RunRow
    from gputui.runs.sweep.runner import Sweep, parse_axis

    preset = tmp_path / "p.toml"
    preset.write_text('[model]\nname = "gpt"\n[data]\nname = "pystdlib"\n', encoding="utf-8")
    axes = {"data.context": parse_axis("--contexts", "data.context", "64,128,64")}
    sweep = Sweep.new(str(preset), [], ["cpu", "cpu*2"], ["single", "cp"], False, tmp_path,
                      [], "cpu", axes)
    assert [p.group for p in sweep.manifest.points] == [
        "single@cpu context=64", "single@cpu context=128", "cp@cpu context=64",
        "cp@cpu context=128", "single@cpu*2 context=64", "single@cpu*2 context=128",
        "cp@cpu*2 context=64", "cp@cpu*2 context=128"]
    assert match_key(RunRow(id="a", context=64)) != match_key(RunRow(id="b", context=128))
