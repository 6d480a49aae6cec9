"""`gputui tune`: the ranking with known inputs, bad input, and one lean end to end on cpu*2
whose order is known by construction (16 micro-batches of two examples per device are far
slower than one batch of 32: measured here 10-25x on the one-device step, where 8 micro-batches
of a smaller batch measured under 2x, within a loaded machine's noise), then its time budget."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import pytest

from gputui.cli import main
from gputui.runs.predict.scaling import Inputs, predict
from gputui.runs.tune.space import Candidate, order, rank


def _cands():
    base = Candidate("ddp", "cpu*2", 2, 64)
    return base, [base, Candidate("ddp", "cpu*2", 2, 64, micro_batches=8),
                  Candidate("ddp", "cpu*2", 2, 128), Candidate("ddp", "cpu*2", 2, 64,
                                                               precision="bf16")]


def test_a_setting_scales_the_compute_not_the_communication_and_memory_can_refuse():
    inp = Inputs(n=2, on_gpu=False, batch=64, batch_1=64, t_1=0.010, t_own={"ddp": 0.006},
                 t_ar=0.004, t_sync=0.0, params=1000, grad_bytes=4000)
    pred = predict("ddp", inp)
    base, cands = _cands()
    factors = {("optim.micro_batches", 8): 5.0, ("run.precision", "bf16"): None}
    got = [rank(c, base, pred, inp, factors, 1.5 if c.batch == 128 else 1.0, None)
           for c in cands]
    assert got[0].step_s == pytest.approx(0.010)  # 6 ms compute + 4 ms allreduce
    assert got[1].step_s == pytest.approx(0.006 * 5 + 0.004)  # compute x5, comm once
    assert got[2].step_s == pytest.approx(0.006 * 1.5 + 0.004)  # twice the batch, x1.5
    assert "not measured within the budget" in got[3].reason  # bf16's factor: none
    ranked = order(got)
    assert [r.cand for r in ranked] == [cands[2], cands[0], cands[1], cands[3]]
    tight = rank(cands[0], base, pred, inp, factors, 1.0, mem_limit=1000)
    assert "GiB per device" in tight.reason and order([tight, got[1]])[0] is got[1]


@pytest.mark.parametrize("argv, says", [
    (["--devices", "0"], "--devices 0: give a device count"),
    (["--devices", "2", "--budget", "0"], "--budget 0: give minutes"),
    (["--devices", "2", "--strategies", "warp"], "unknown warp"),
    (["--devices", "2", "--micro-batches", "1,x"], "--micro-batches 1,x"),
    (["--devices", "2", "--precisions", "fp8"], "'fp8' is not one of"),
    (["--devices", "cpu*2", "--strategies", "model_parallel", "--micro-batches", "4096"],
     "no candidate configuration can run"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, says):
    code = main(["tune", "quickstart", *argv, "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 30 s on two idle cores; far more on a shared, loaded one
def test_tune_ranks_confirms_writes_a_preset_and_respects_its_budget(tmp_path):
    env = dict(os.environ, GPUTUI_CACHE_DIR=str(tmp_path / "cache"))
    best = tmp_path / "best.toml"
    cmd = [sys.executable, "-m", "gputui", "tune", "quickstart", "--devices", "cpu*2",
           "--set", "model.name=mlp", "--set", "optim.batch_size=64", "--strategies",
           "scratch", "--micro-batches", "1,16", "--precisions", "fp32", "--compile", "off",
           "--batch-per-device", "32", "--top", "2", "--steps", "20", "--json",
           "--runs-dir", str(tmp_path / "runs")]
    first = subprocess.run(cmd + ["-o", str(best)], capture_output=True, text=True, env=env,
                           timeout=900)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    mb = [c["optim.micro_batches"] for c in out["candidates"]]
    assert mb == [1, 16]  # predicted: one batch first
    assert all(c["status"] == "finished" and c["samples_per_s"] for c in out["candidates"])
    assert out["candidates"][0]["samples_per_s"] > out["candidates"][1]["samples_per_s"]
    assert out["chosen"]["optim.micro_batches"] == 1 and out["written"] == str(best)
    assert "measuring the prediction's inputs" in first.stderr
    assert "[2/2] scratch on cpu*2: finished" in first.stderr
    assert main(["run", str(best), "--dry-run"]) == 0  # the preset loads as it is
    text = best.read_text()
    assert text.startswith("# Tuned by `gputui tune quickstart") and "micro_batches = 1" in text
    # the kept figures as if measured on a quiet machine, so the second call measures nothing
    cache = next((tmp_path / "cache").glob("predict-*.json"))
    kept = json.loads(cache.read_text())
    for v in kept.values():
        v["machine"] = dict(v["machine"], contended=False)
    cache.write_text(json.dumps(kept))
    # a budget that cannot buy one confirming run is refused before anything runs, naming
    # the least that can (from the kept one-device step)
    tight = subprocess.run(cmd + ["--budget", "0.02", "-o", str(tmp_path / "b2.toml")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert tight.returncode == 2 and tight.stderr.count("\n") == 1, tight.stderr
    assert tight.stderr.startswith("gputui: error: --budget 0.02: too short to confirm even "
                                   "one candidate"), tight.stderr
    assert "kept one-device step" in tight.stderr and not (tmp_path / "b2.toml").exists()
    least = re.search(r"give --budget ([\d.]+) or more", tight.stderr).group(1)
    # that least budget buys one confirmation at least, whatever the machine's speed (the
    # first confirming run always runs: the measuring kept its time free)
    enough = subprocess.run(cmd + ["--budget", least, "-o", str(tmp_path / "b3.toml")],
                            capture_output=True, text=True, env=env, timeout=600)
    assert enough.returncode == 0, enough.stderr
    out = json.loads(enough.stdout)
    assert "  measured " not in enough.stderr
    assert out["candidates"][0]["samples_per_s"], out
    assert (tmp_path / "b3.toml").exists()


@pytest.mark.parametrize("budget", ["inf", "nan", "-inf"])
def test_a_budget_that_is_not_a_number_of_minutes_is_refused(budget, tmp_path):
    """--budget inf (or nan) would measure without end: one line, exit 2, nothing written."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gputui", "tune", "quickstart", "--devices",
                          "2", f"--budget={budget}"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2 and f"'{budget}' is not a finite number" in out.stderr
    assert out.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []
