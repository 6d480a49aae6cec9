"""The commands of the README and of the pages under docs/, run as written, so they cannot
drift from the code.

Every line of their ``sh`` blocks is a command a newcomer copies. The README's first two
blocks (install + app, install + tests) are what CI runs (the line after ``<!-- test-command
-->``); here they are checked for shape. Every other ``.venv/bin/gputui`` line is run once
(a line on several pages too), in this process through ``gputui.cli.main`` from the clone's
folder (records go to a temp folder through GPUTUI_RUNS_DIR), exactly as written except for:

* the placeholders the README defines: ``RUN`` (each one a run recorded by an earlier line;
  for ``compare``, the runs of the last sweep, which are runs of the same work) and
  ``SWEEP_ID`` (the sweep an earlier line ran);
* small overrides appended so the suite stays fast: ``run``, ``resume`` and ``sweep`` train
  1 epoch on 512 images (resume: the run it continues is that small; gpt-tiny's sweep 256
  sequences), ``bench-comm`` times
  one small size once, ``tune`` measures and confirms one small candidate (its preset and
  kept figures go to the temp folder), ``verify`` compares 2 steps;
* ``--dry-run`` appended to a ``run`` line whose point is its flags (``--epochs``,
  ``--strategy``, ``--set``, ``--devices``): the preset is loaded, the flags applied and every
  rule checked against this machine's devices and disk, as for a real run, but nothing
  trains. Lines whose output or record is the point (the first run of each preset or file,
  ``--json``, ``--quiet``) train for real; a sweep of a preset counts as its first run (its
  points are real runs of it).

``.venv/bin/pip install -e '.[X]'`` lines are checked against pyproject's extras (not run:
they need the network), ``.venv/bin/python FILE`` lines against the files.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import tomllib
from pathlib import Path

import pytest

from gputui import cli
from gputui.runs.sweep.runner import load_manifest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
SHRINK = {"run": ["--epochs", "1", "--set", "data.train_size=512", "--set", "data.test_size=128"],
          "sweep": ["--epochs", "1", "--set", "data.train_size=512", "--set",
                    "data.test_size=128"],
          "bench-comm": ["--sizes", "4K", "--iters", "2", "--warmup", "1", "--repeats", "1"],
          # one candidate, measured and confirmed: test_tune ranks and confirms several
          "tune": ["--set", "model.name=mlp", "--set", "optim.batch_size=32", "--strategies",
                   "single", "--micro-batches", "1", "--precisions", "fp32", "--compile", "off",
                   "--batch-per-device", "16", "--top", "1", "--steps", "20"],
          "verify": ["--steps", "2"]}
# the gpt-tiny sweep's 7 points train 256 sequences, 8 steps (its warm-up cut to 2 to fit):
# 57 CPU-seconds in place of 73 at 512 on 2 cores
SHRINK_SWEEP_OF = {"gpt-tiny": ["--set", "data.train_size=256", "--set", "optim.warmup_steps=2"]}
FLAG_ONLY = ("--epochs", "--lr", "--strategy", "--set", "--devices", "--batch-size", "--seed")
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]


def sh_blocks(text: str) -> list[list[str]]:
    """The command lines of every ```sh block, as written, without comments or blank lines."""
    blocks = []
    for body in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        lines = [ln.split(" #", 1)[0].strip() for ln in body.splitlines()]
        blocks.append([ln for ln in lines if ln and not ln.startswith("#")])
    return blocks


def command_lines() -> list[str]:
    """Every command line of the README (but its two set-up blocks) and of docs/, each once, in
    the order a reader meets them: the README first, then the pages by name."""
    lines = [ln for block in sh_blocks(README)[2:] for ln in block]
    for name, text in PAGES.items():
        if name != "README.md":
            lines += [ln for block in sh_blocks(text) for ln in block]
    return list(dict.fromkeys(lines))


def test_the_set_up_lines_are_what_ci_runs_and_install_the_console_script():
    setup, tests = sh_blocks(README)[:2]
    assert setup == ["python3 -m venv .venv && .venv/bin/pip install -e . -c constraints.txt "
                     "&& .venv/bin/gputui --preset quickstart"]
    after_marker = README.split("<!-- test-command -->\n", 1)[1].split("\n")
    assert after_marker[0] == "```sh" and after_marker[1] == tests[0]
    assert "'.[test]'" in tests[0]
    # the static checks run before the suite, so CI fails on a lint or type error
    assert tests[0].endswith(" && .venv/bin/ruff check gputui && .venv/bin/mypy gputui"
                             " && .venv/bin/python -m pytest -q -n auto --maxprocesses 4"
                             " --dist loadfile"), tests[0]
    # a test file runs whole on one worker: its module fixtures (one launch for many tests)
    # are paid once; pytest-xdist is a test extra
    assert "pytest-xdist" in {re.split(r"[<>=!~ ]", d)[0] for d in EXTRAS["test"]}
    assert {"ruff", "mypy"} <= {re.split(r"[<>=!~ ]", d)[0] for d in EXTRAS["test"]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["gputui"] == "gputui.cli:main"


def test_the_readme_fits_on_a_few_screens_and_links_pages_that_exist():
    assert len(README.splitlines()) <= 150
    assert re.search(r"!\[[^]]*\]\(docs/[\w-]+\.png\)", README)  # a picture a browser shows
    for name, text in PAGES.items():
        base = (ROOT / name).parent
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"\w+://", target):
                assert (base / target).exists(), f"{name}: no {target}"


def test_every_line_is_a_venv_command_that_exists():
    lines = command_lines()
    assert len(lines) >= 20
    for line in lines:
        if line.startswith("python3 -m venv .venv && .venv/bin/pip install -e "):  # a set-up
            for extra in re.findall(r"'\.\[(\w+)\]'", line):
                assert extra in EXTRAS, line
            assert ".venv/bin/python -m pytest" in line, line
        elif line.startswith(".venv/bin/pip install -e "):
            (extra,) = re.fullmatch(r"\.venv/bin/pip install -e '\.\[(\w+)\]'", line).groups()
            assert extra in EXTRAS, line
        elif line.startswith(".venv/bin/python "):
            assert (ROOT / line.split()[1]).is_file(), line
        else:
            assert line.startswith(".venv/bin/gputui "), f"not runnable as written: {line}"
    for name, text in PAGES.items():
        for path in re.findall(r"`\.venv/bin/python ([\w/.]+\.py)", text):
            assert (ROOT / path).is_file(), f"{name}: {path}"


def test_steps_an_epoch_are_what_runs_take():
    """"N images make S steps an epoch": S is what a run prints, N // batch (the last
    partial batch is dropped), in the presets' headers and in these pages."""
    claims = []
    for path in sorted((ROOT / "presets").glob("*.toml")):
        text = path.read_text()
        batch = int(re.search(r"^batch_size = (\d+)", text, re.M).group(1))
        header = " ".join(ln.lstrip("# ") for ln in text.splitlines() if ln.startswith("#"))
        claims += [(path.name, batch, c) for c in re.findall(
            r"([\d,]+) images(?: make|:) (\d+) steps an epoch", header)]
    for name, text in PAGES.items():
        claims += [(name, int(b), (n, s)) for n, s, b in re.findall(
            r"([\d,]+) images make (\d+) steps an epoch of batch\s+(\d+)", text)]
    assert len(claims) >= 5
    for where, batch, (images, steps) in claims:
        assert int(steps) == int(images.replace(",", "")) // batch, (where, images, steps)


def _argv(line: str, runs: list[str], sweep_id: str | None, seen: set[str],
          sweep_runs: list[str] | None = None) -> list[str]:
    """The arguments of a documented line, as this test runs it (see the module docstring)."""
    argv = shlex.split(line)[1:]
    command = argv[0]
    if "RUN" in argv:
        assert runs, f"no run recorded before: {line}"
        # compare pairs runs of the same work, as the README's line says: a sweep's runs
        ids = iter(sweep_runs if command == "compare" and sweep_runs else runs)
        argv = [next(ids) if w == "RUN" else w for w in argv]
    if "SWEEP_ID" in argv:
        assert sweep_id, f"no sweep ran before: {line}"
        argv = [sweep_id if w == "SWEEP_ID" else w for w in argv]
    if command == "sweep":  # a sweep's points are real runs of its preset or file
        seen.add(argv[1])
    if command == "run" and "--dry-run" not in argv:
        real = argv[1] not in seen or "--json" in argv or "--quiet" in argv
        seen.add(argv[1])
        if not real:
            assert any(f in argv for f in FLAG_ONLY), line
            argv.append("--dry-run")
    extra = SHRINK_SWEEP_OF.get(argv[1], []) if command == "sweep" else []
    return argv + SHRINK.get(command, []) + extra


@pytest.mark.slow
# every documented command in turn, about 20 runs: 2 minutes on 2 idle cores, 10 at load 20,
# where the suite's 300 s guard per test stopped it; its own guard is half an hour
@pytest.mark.timeout(1800)
def test_every_gputui_line_runs_as_written(tmp_path, monkeypatch, capsys):
    runs_dir = tmp_path / "runs"
    monkeypatch.setenv("GPUTUI_RUNS_DIR", str(runs_dir))
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "cache"))  # tune's kept figures
    monkeypatch.chdir(ROOT)  # relative paths (examples/tiny.toml) as a reader's shell has them
    sweep_id, seen = None, set()
    for line in [ln for ln in command_lines() if ln.startswith(".venv/bin/gputui ")]:
        runs = sorted(p.name for p in runs_dir.iterdir() if p.name != "sweeps") \
            if runs_dir.is_dir() else []
        sweep_runs = [p.run_id for p in load_manifest(runs_dir, sweep_id).points
                      if p.run_id] if sweep_id else []
        argv = _argv(line, runs, sweep_id, seen, sweep_runs)
        if argv[0] == "tune":  # its preset into the temp folder, not the clone's presets/
            argv += ["-o", str(tmp_path / "tuned.toml")]
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                                     signal.SIGHUP, signal.SIGUSR1)}
        try:
            code = cli.main(argv)
        finally:  # `run` and `sweep` take the stop signals for their run; give them back
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        out, err = capsys.readouterr()
        assert code == 0, f"{line}\n{argv}\n{out}\n{err}"
        assert "Traceback" not in out + err, line
        if argv[0] == "sweep":
            sweep_id = re.search(r"^sweep ([\w-]+)\b", out + err, re.M).group(1)
        if "--quiet" in argv:  # the summary line and the record's path, nothing else (but
            # the warning that the machine's load made its speed no baseline, when it did)
            summary, record = [ln for ln in out.splitlines()
                               if not ln.startswith("warning: its speed is not a baseline: ")]
            assert summary.startswith("summary: status finished, ") and "test acc " in summary
            assert record.startswith("record: ") and (ROOT / record[8:]).is_dir()
        if "--json" in argv and argv[0] == "run":
            assert json.loads(out)["status"] == "finished"
    assert sweep_id and len(list(runs_dir.iterdir())) >= 9
