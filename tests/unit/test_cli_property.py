"""Property tests of the whole command line (hypothesis), in-process through ``cli.main``:
every command's flags and arguments, and every key ``run --dry-run`` prints (through ``--set``,
a flag and a preset file), given hostile values (NaN, infinities, huge, negative, zero, empty,
very long, unicode, undecodable bytes, TOML tables and lists where a scalar goes), end in exit
0, or in one line on stderr and exit 2 with nothing written under the runs folder; never a
traceback or another exit status.

What would start work (a spawned process: a run host, a sweep point, a measurement) is the
boundary: starting one raises ``Launched`` here, which means the input was accepted. What a
started run does with it is the rest of the suite's."""

from __future__ import annotations

import contextlib
import io
import os
import multiprocessing.process
import subprocess
import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputui import cli

HOSTILE = ["nan", "NaN", "inf", "-inf", "1e309", "-1e309", "-1", "0", "-0", "", " ", "1.5",
           "99999999999999999999999", "-99999999999999999999", "1e-320", "0x10", "1_000",
           "true", "[1, 2]", "[]", "{a = 1}", "{}", "[[1]]", "x" * 5000, "🙂", "é" * 300,
           "\udcff", "\udcfe\udcff", "../../etc", "/dev/null", "/", ".", "cpu*2", "cpu*0",
           "cpu*-1", "cuda:9", "all", "[/bold]q", "a\nb", "\t", "=", "==", "a=b", "--", "-x",
           "single", "ddp", "quickstart", "gpt", "'quoted'", '"dq"', "\\", "%s%n", "${HOME}"]
values = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20).filter(lambda s: "\0" not in s))


class Launched(BaseException):
    """Raised where a command would start a process: its input was accepted."""


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A cwd, runs folder and home of the test's own; process starts become ``Launched``."""
    def refuse(*_a, **_k):
        raise Launched

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUTUI_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    return tmp_path


def written(root) -> set[str]:
    runs = root / "runs"
    return {str(p.relative_to(root)) for p in runs.rglob("*")} if runs.exists() else set()


def call(argv: list[str], root) -> None:
    """Run ``gputui ARGV``: exit 0, or exit 2 with one line and nothing new on disk."""
    before = written(root)
    err, out = io.StringIO(), io.StringIO()
    code: int | str | None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse: --help, or a usage error
            code = exc.code
        except Launched:
            return
    lines = err.getvalue().strip().splitlines()
    assert code in (0, 2, None), (argv, code, err.getvalue()[-2000:])
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue()[-2000:])
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("gputui"), (argv, lines[:5])
        assert written(root) == before, argv


def commands() -> dict[str, list]:
    """{command: its optional actions} from the real parser (the app itself, no command,
    opens the terminal: not here)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: p._actions for name, p in sub.choices.items()}


COMMANDS = commands()
POSITIONAL = {"run": ["quickstart"], "sweep": ["quickstart"], "predict": ["quickstart"],
              "resume": ["20260101-000000-x"], "compare": []}


@st.composite
def argvs(draw, command: str) -> list[str]:
    argv = [command]
    for action in COMMANDS[command]:
        if action.option_strings and action.option_strings[0] in ("-h", "--help"):
            continue
        if not action.option_strings:  # positional: a real value or a hostile one
            nargs = action.nargs
            if nargs in ("*", "?") and draw(st.booleans()):
                continue
            real = POSITIONAL.get(command, [])
            argv.append(draw(st.one_of(st.sampled_from(real), values) if real else values))
            continue
        if not draw(st.integers(0, 3)) == 0:  # most flags left out, so each one is reached
            continue
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, draw(values)]
    if command in ("run", "resume") and "--dry-run" in COMMANDS_FLAGS[command] and \
            draw(st.booleans()):
        argv.append("--dry-run")
    return argv


COMMANDS_FLAGS = {c: {s for a in acts for s in a.option_strings} for c, acts in COMMANDS.items()}
FEW = settings(max_examples=int(os.environ.get("GPUTUI_HYPOTHESIS_EXAMPLES", 100)), deadline=None,
               derandomize="GPUTUI_HYPOTHESIS_EXAMPLES" not in os.environ,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_flags_take_any_value(command, sandbox):
    @FEW
    @given(argv=argvs(command))
    def check(argv):
        call(argv, sandbox)

    check()


def dry_run_keys() -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["run", "quickstart", "--dry-run"]) == 0
    doc = tomllib.loads(out.getvalue())
    return [f"{t}.{k}" for t, keys in doc.items() for k in keys]


KEYS = dry_run_keys()


@settings(max_examples=int(os.environ.get("GPUTUI_HYPOTHESIS_EXAMPLES", 200)), deadline=None,
          derandomize="GPUTUI_HYPOTHESIS_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=values, how=st.sampled_from(["set", "file"]))
def test_every_dry_run_key_takes_any_value_through_set_and_a_preset_file(sandbox, key, value,
                                                                          how):
    if how == "set":
        call(["run", "quickstart", "--dry-run", "--set", f"{key}={value}"], sandbox)
        return
    table, name = key.split(".", 1)
    path = sandbox / "hostile.toml"
    # the value as TOML where it parses as one, else as a string
    try:
        tomllib.loads(f"v = {value}")
        literal = value
    except (tomllib.TOMLDecodeError, ValueError):
        literal = '"' + value.replace("\\", "\\\\").replace('"', '\\"').encode(
            "utf-8", "surrogateescape").decode("utf-8", "replace").replace("\n", "\\n") + '"'
    path.write_text(f"[{table}]\n{name} = {literal}\n", encoding="utf-8", errors="replace")
    call(["run", str(path), "--dry-run"], sandbox)
