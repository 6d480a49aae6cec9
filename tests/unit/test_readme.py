"""The README's commands, run as written, so they cannot drift from the code.

Every line of the README's ``sh`` blocks is a command a newcomer copies. The first two blocks
(install + app, install + tests) are what CI runs (the line after ``<!-- test-command -->``);
here they are checked for shape. Every other line is run through bash from the clone's folder
(records go to a temp folder through GPUTUI_RUNS_DIR), exactly as written except for:

* ``.venv/bin/gputui`` -> this interpreter's ``python -m gputui`` (the same package; the
  console script itself is checked in pyproject.toml),
* the placeholders the README defines: ``RUN`` (each one a run recorded by an earlier line)
  and ``SWEEP_ID`` (the sweep an earlier line ran),
* small overrides appended so the suite stays fast: ``run`` and ``sweep`` train 1 epoch on
  512 images, ``bench-comm`` times one small size.

``.venv/bin/pip install -e '.[X]'`` lines are checked against pyproject's extras (not run:
they need the network), ``.venv/bin/python FILE`` lines against the files.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SHRINK = {"run": "--epochs 1 --set data.train_size=512 --set data.test_size=128",
          "sweep": "--epochs 1 --set data.train_size=512 --set data.test_size=128",
          "bench-comm": "--sizes 4K --iters 2 --warmup 1"}


def sh_blocks() -> list[list[str]]:
    """The command lines of every ```sh block, as written, without comments or blank lines."""
    blocks = []
    for body in re.findall(r"```sh\n(.*?)```", README, flags=re.S):
        lines = [ln.split(" #", 1)[0].strip() for ln in body.splitlines()]
        blocks.append([ln for ln in lines if ln and not ln.startswith("#")])
    return blocks


def test_the_set_up_lines_are_what_ci_runs_and_install_the_console_script():
    setup, tests = sh_blocks()[:2]
    assert setup == ["python3 -m venv .venv && .venv/bin/pip install -e . -c constraints.txt "
                     "&& .venv/bin/gputui --preset quickstart"]
    after_marker = README.split("<!-- test-command -->\n", 1)[1].split("\n")
    assert after_marker[0] == "```sh" and after_marker[1] == tests[0]
    assert "'.[test]'" in tests[0]
    # the static checks run before the suite, so CI fails on a lint or type error
    assert tests[0].endswith(" && .venv/bin/ruff check gputui && .venv/bin/mypy gputui"
                             " && .venv/bin/python -m pytest -q"), tests[0]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"ruff", "mypy"} <= {re.split(r"[<>=!~ ]", d)[0] for d in extras["test"]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["gputui"] == "gputui.cli:main"


def test_every_quick_path_line_is_a_venv_command_that_exists():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    lines = [ln for block in sh_blocks()[2:] for ln in block]
    assert len(lines) >= 15
    for line in lines:
        if line.startswith("python3 -m venv .venv && .venv/bin/pip install -e "):  # a set-up
            for extra in re.findall(r"'\.\[(\w+)\]'", line):
                assert extra in extras, line
            assert ".venv/bin/python -m pytest" in line, line
        elif line.startswith(".venv/bin/pip install -e "):
            (extra,) = re.fullmatch(r"\.venv/bin/pip install -e '\.\[(\w+)\]'", line).groups()
            assert extra in extras, line
        elif line.startswith(".venv/bin/python "):
            assert (ROOT / line.split()[1]).is_file(), line
        else:
            assert line.startswith(".venv/bin/gputui "), f"not runnable as written: {line}"
    for path in re.findall(r"`\.venv/bin/python ([\w/.]+\.py)`", README):
        assert (ROOT / path).is_file(), path


def _runs(env_runs: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "gputui", "runs", "--json", "--runs-dir",
                          str(env_runs)], capture_output=True, text=True, timeout=60)
    return [r["id"] for r in sorted(json.loads(out.stdout), key=lambda r: r["id"])]


@pytest.mark.slow
def test_every_gputui_line_of_the_readme_runs_as_written(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("GPUTUI_RUNS_DIR", str(runs))
    python = shlex.quote(sys.executable)
    sweep_id = None
    lines = [ln for block in sh_blocks()[2:] for ln in block
             if ln.startswith(".venv/bin/gputui ")]
    for line in lines:
        command = line.split()[1]
        text = line.replace(".venv/bin/gputui", f"{python} -m gputui", 1)
        if "RUN" in text.split():
            ids = iter(_runs(runs))
            text = " ".join(next(ids) if w == "RUN" else w for w in text.split(" "))
        if "SWEEP_ID" in text:
            assert sweep_id, f"no sweep ran before: {line}"
            text = text.replace("SWEEP_ID", sweep_id)
        text += " " + SHRINK.get(command, "")
        proc = subprocess.run(["bash", "-c", text], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stdout + proc.stderr, line
        if command == "sweep":
            sweep_id = re.search(r"^sweep ([\w-]+)\b", proc.stdout + proc.stderr, re.M).group(1)
        if "--quiet" in line:  # the summary line and the record's path, nothing else
            summary, record = proc.stdout.splitlines()
            assert summary.startswith("summary: status finished, ") and "test acc " in summary
            assert record.startswith("record: ") and Path(record[8:]).is_dir()
    assert sweep_id and len(_runs(runs)) >= 9
