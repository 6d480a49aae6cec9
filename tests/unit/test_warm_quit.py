"""Quitting the app does not wait for its warm host (issue 26: Ctrl+Q on an idle set-up
screen took 2.3 s, the warm host's torch import): an idle warm host is killed at once, and
no process is left behind."""

from __future__ import annotations

import time

import psutil
import pytest

from gputui.runs import warm

pytestmark = pytest.mark.slow


def test_closing_an_idle_warm_host_is_immediate_and_leaves_nothing():
    warm.close_all()
    host = warm.ensure_host()  # still importing torch: what the app quits during
    pid = host.process.pid
    time.sleep(0.3)
    t0 = time.monotonic()
    warm.close_all()  # what the app's exit runs (atexit)
    took = time.monotonic() - t0
    assert took < 0.5, f"closing the idle warm host took {took:.2f} s"
    assert not host.process.is_alive() and not psutil.pid_exists(pid)
