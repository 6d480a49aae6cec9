"""Same seed, same run, for a model with dropout: the training process's global generator
follows run.seed (dropout masks are drawn from it), single and ddp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = '''
from torch import nn

def build(channels, height, width, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 32), nn.ReLU(),
                         nn.Dropout(0.5), nn.Linear(32, classes))
'''


def losses(tmp_path: Path, tag: str, *extra: str) -> list[float]:
    runs = tmp_path / f"runs-{tag}"
    done = subprocess.run(
        [sys.executable, "-m", "gputui", "run", "quickstart", "--runs-dir", str(runs),
         "--epochs", "1", "--batch-size", "64", "--set", f"model.factory={tmp_path}/m.py:build",
         "--set", "data.train_size=512", "--set", "data.test_size=64", "--set",
         "run.log_every=2", "--set", "telemetry.enabled=false", "--set", "run.seed=7", *extra],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = [p for p in runs.iterdir() if (p / "events.jsonl").exists()]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    out = [e["loss"] for e in events if e.get("type") == "step"]
    assert out, events[:3]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("extra", [("--devices", "cpu", "--strategy", "single"),
                                   ("--devices", "cpu*2", "--strategy", "ddp")])
def test_a_dropout_model_repeats_with_its_seed(tmp_path, extra):
    (tmp_path / "m.py").write_text(MODEL)
    assert losses(tmp_path, "a", *extra) == losses(tmp_path, "b", *extra)
