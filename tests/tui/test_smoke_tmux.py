"""Runs scripts/tui_smoke.py: the real app in tmux, driven by keys, read by capture-pane."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tui_smoke.py"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None,
                    reason="tmux is not installed (apt-get install -y tmux)")
def test_the_app_in_a_real_terminal():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "smoke test passed" in out.stdout
