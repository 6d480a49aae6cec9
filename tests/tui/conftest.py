"""Fixtures for the app's tests: a fixed device inventory, a scripted launcher, a preset list."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from scripted import ScriptedLauncher, fixed_inventory  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def inventory():
    return fixed_inventory()


@pytest.fixture
def launcher():
    return ScriptedLauncher()


@pytest.fixture
def presets():
    """The repo's quickstart only, so screens do not depend on which presets exist."""
    return [REPO / "presets" / "quickstart.toml"]
