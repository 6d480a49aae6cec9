"""A preset that names code: the keys, their checks (files read, nothing run), and what the
CLI shows before anything runs. Torch-free: the CLI never imports the user's code or torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gputui.core.config import ConfigError, RunConfig, apply_overrides
from gputui.core.usercode import code_line, find_problem, parse
from gputui.runs.prepare import load_checked, override_checked

GPUTUI = [sys.executable, "-m", "gputui"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's folder: a factory file that leaves a mark if it is ever imported, a package,
    and a preset naming both."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(textwrap.dedent("""
        from pathlib import Path
        Path(__file__).with_name("IMPORTED").write_text("yes")
        def build(c, h, w, k, width=4):
            raise SystemExit("never called in these tests")
        if __name__ == "__main__":
            def main(): pass
    """))
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise RuntimeError('ran the package')\n")
    (tmp_path / "mypkg" / "data.py").write_text("from os import path as p\ndef load(): pass\n")
    (tmp_path / "own.toml").write_text(textwrap.dedent("""
        [model]
        factory = "nets.py:build"
        kwargs = { width = 8 }
        [data]
        factory = "mypkg.data:load"
    """))
    return tmp_path


def test_specs_parse_into_their_kinds():
    assert parse("pkg.mod:fn").kind == "module"
    assert parse("a/b.py:fn").kind == "file"
    assert parse("nets.py:fn").kind == "file"
    assert parse("torchvision:resnet50").kind == "torchvision"
    assert parse("imagefolder:/data/pets").target == "/data/pets"
    for bad in ("nocolon", "pkg.mod:", ":fn", "pkg.mod:not-a-name", "pk g:fn"):
        with pytest.raises(ValueError):
            parse(bad)


def test_a_preset_naming_code_loads_without_running_it(project):
    cfg = load_checked(project / "own.toml").config  # every check, the files read
    assert cfg.model.kwargs == {"width": 8}
    # relative to the preset's folder, made absolute so a resume finds it from anywhere
    assert cfg.model.factory == f"{project / 'nets.py'}:build"
    assert cfg.data.factory == "mypkg.data:load"
    assert not (project / "IMPORTED").exists()  # read and parsed, never imported
    assert code_line(cfg) == (f"runs your code: model.factory = {project / 'nets.py'}:build; "
                              f"data.factory = mypkg.data:load")
    assert code_line(RunConfig()) == ""


@pytest.mark.parametrize("spec,expected", [
    ("nets.py:buld", "nets.py defines no 'buld'; name a function it defines"),
    ("nope.py:build", "no file nope.py (paths are relative to the folder gputui runs in"),
    ("mypkg.dta:load", "no module named 'mypkg.dta' in mypkg"),
    ("nopkg.data:load", "no module named 'nopkg' in the current folder or the Python path"),
    ("mypkg.data:lod", "data.py defines no 'lod'"),
    ("main:build", "no module named 'main'"),
    ("imagefolder:pets", "no train/ or test/ folder in pets"),
])
def test_a_factory_that_cannot_be_found_is_one_line(project, spec, expected):
    problem = find_problem(spec, "model.factory")
    assert problem is not None and expected in problem, problem
    with pytest.raises(ConfigError, match="^--set: model.factory = ") as err:  # the flag's
        override_checked(RunConfig(), [("--set", "model.factory", spec)], preset_source="form")
    assert "\n" not in str(err.value)
    assert not (project / "IMPORTED").exists()


def test_names_bound_in_blocks_and_star_imports_are_not_refused(project):
    assert find_problem("nets.py:main") is None  # defined under if __name__ == "__main__"
    (project / "star.py").write_text("from os.path import *\n")
    assert find_problem("star.py:join") is None  # cannot be known without running it
    (project / "broken.py").write_text("def build(:\n")
    assert "is not valid Python" in find_problem("broken.py:build")


def test_bad_keys_and_values_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="unknown key 'model.factroy'; did you mean 'model.factory'"):
        apply_overrides(RunConfig(), [("--set", "model.factroy", "x:y")])
    with pytest.raises(ConfigError, match=r"model.kwargs must be a table"):
        apply_overrides(RunConfig(), [("--set", "model.kwargs", "8")])
    with pytest.raises(ConfigError, match="write it as 'package.module:function'"):
        apply_overrides(RunConfig(), [("--set", "data.factory", "nocolon")])


def test_the_cli_shows_code_and_runs_none_of_it(project):
    proc = subprocess.run([*GPUTUI, "run", "own.toml", "--dry-run"], capture_output=True,
                          text=True, cwd=project, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first == (f"# runs your code: model.factory = {project / 'nets.py'}:build; "
                     f"data.factory = mypkg.data:load (not run by --dry-run)")
    assert not (project / "IMPORTED").exists()
    # the same check in this process: nothing of torch or the user's code is imported
    probe = ("import sys; from gputui.cli import build_parser, resolve_config; "
             "resolve_config(build_parser().parse_args(['run', 'own.toml'])); "
             "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'nets', 'mypkg')]; "
             "print(bad)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=project, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_typo_in_a_factory_exits_2_before_any_run(project):
    proc = subprocess.run([*GPUTUI, "run", "own.toml", "--set", "model.factory=nets.py:buld",
                           "--runs-dir", "runs"], capture_output=True, text=True, cwd=project,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gputui: error: --set model.factory=nets.py:buld: model.factory = 'nets.py:buld': "
        "nets.py defines no 'buld'; name a function it defines"]
    assert not (project / "runs").exists()


def test_presets_are_listed_with_the_code_they_run(project):
    (project / "presets").mkdir()
    (project / "presets" / "mine.toml").write_text(
        "# my model\n[model]\nfactory = \"nets.py:build\"\n")
    proc = subprocess.run([*GPUTUI, "presets", "--json"], capture_output=True, text=True,
                          cwd=project, timeout=60)
    listed = {p["name"]: p["runs_code"] for p in json.loads(proc.stdout)}
    assert listed["mine"] == ["model.factory = nets.py:build"]
    assert listed["quickstart"] == []
    text = subprocess.run([*GPUTUI, "presets"], capture_output=True, text=True, cwd=project,
                          timeout=60).stdout
    mine = next(line for line in text.splitlines() if line.startswith("mine "))
    assert mine.endswith("my model  [runs your code: model.factory = nets.py:build]")
