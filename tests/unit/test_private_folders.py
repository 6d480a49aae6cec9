"""No test reads or writes the user's own folders: every default path gputui uses lies in the
test's temp folder (conftest's _private_folders), and a session in which a test changed the
user's cache fails (conftest's pytest_sessionfinish)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_every_default_path_lies_in_the_tests_own_folder():
    """Every default path is in the test's private home (conftest), none in the user's."""
    from gputui.core.cachedir import cache_dir
    from gputui.core.config_schema import default_data_root
    from gputui.core.runstore import default_runs_dir
    from gputui.runs.predict.cache import Cache
    from gputui.train import flops

    for path in (cache_dir(), flops.cache_path(), Cache().path, Path(default_data_root()),
                 Path.home(), Path(os.path.expanduser("~")), default_runs_dir()):
        home = Path(os.environ["HOME"]).resolve().parent  # the test's private folder
        assert path.resolve().is_relative_to(home) and home.name.startswith("private"), path


def test_the_flops_peak_is_kept_in_gputuis_cache_folder(tmp_path, monkeypatch):
    """GPUTUI_CACHE_DIR moves every kept measurement, the FLOP/s peak included."""
    from gputui.train import flops

    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert flops.cache_path() == tmp_path / "elsewhere" / "peak_flops.json"
    measured = []

    def measure() -> float:
        measured.append(1)
        return 1e9

    # a peak kept there (measured on a quiet machine) is read from there, not measured again
    (tmp_path / "elsewhere").mkdir()
    quiet = "cpu|test cpu|fp32|threads=1"
    (tmp_path / "elsewhere" / "peak_flops.json").write_text(json.dumps(
        {quiet: {"flops": 5e9, "machine": {"contended": False}}}))
    assert flops._cached(quiet, measure) == 5e9 and measured == []
    # one not kept is measured and written there, beside the other
    assert flops._cached("cpu|test cpu|bf16|threads=1", measure) == 1e9 and measured == [1]
    kept = json.loads((tmp_path / "elsewhere" / "peak_flops.json").read_text())
    assert kept[quiet]["flops"] == 5e9 and kept["cpu|test cpu|bf16|threads=1"]["flops"] == 1e9
    # a cache folder that cannot be written: measured, not kept, no traceback
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "elsewhere" / "peak_flops.json"))
    assert flops._cached(quiet, measure) == 1e9 and measured == [1, 1]

INNER = """
import os
from pathlib import Path

def test_inner(tmp_path):
    (tmp_path / "mine.txt").write_text("a test's own file")
    if os.environ["INNER_WRITES"] == "1":
        users = Path(os.environ["INNER_REAL_HOME"]) / ".cache" / "gputui"
        users.mkdir(parents=True, exist_ok=True)
        (users / "predict-host.json").write_text("{}")
"""


def inner_session(tmp_path, writes: bool) -> subprocess.CompletedProcess:
    """A pytest session under this suite's conftest, in a home of its own (the "user's")."""
    home = tmp_path / f"home-{int(writes)}"
    home.mkdir()
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "GPUTUI_CACHE_DIR", "PYTEST_ADDOPTS")}
    env.update(HOME=str(home), INNER_REAL_HOME=str(home), INNER_WRITES=str(int(writes)),
               PYTHONPATH=str(ROOT / "tests"))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_inner.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_session_that_wrote_the_users_cache_fails(tmp_path):
    quiet = inner_session(tmp_path, writes=False)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    wrote = inner_session(tmp_path, writes=True)
    assert wrote.returncode == 1 and "1 passed" in wrote.stdout, wrote.stdout + wrote.stderr
    assert "A test changed the user's own folders" in wrote.stderr
    assert str(tmp_path / "home-1" / ".cache" / "gputui") in wrote.stderr
