"""Any TOML the parser can return, and any it cannot, gives one line and exit 2: nesting deep
enough to exhaust Python's recursion (in the parser, or later in whatever writes the value
back), integers longer than Python converts, and syntax errors."""

from __future__ import annotations

import pytest

from gputui import cli
from gputui.core import presets, safeio
from gputui.runs import history

DEEP_ARRAY = "[model]\nkwargs = { a = " + "[" * 5000 + "]" * 5000 + " }\n"
DEEP_TABLE = "[model]\nkwargs = " + "{ a = " * 2000 + "1" + " }" * 2000 + "\n"
MEDIUM = "[model]\nkwargs = { a = " + "[" * 200 + "]" * 200 + " }\n"  # parses; dumps would not
LONG_INT = "[run]\nseed = " + "9" * 5000 + "\n"


@pytest.mark.parametrize("text,words", [
    (DEEP_ARRAY, "nested"), (DEEP_TABLE, "nested"), (MEDIUM, "nested more than"),
    (LONG_INT, "not valid TOML"), ("[run\n", "not valid TOML"),
])
def test_pathological_presets_are_one_line_exit_2(tmp_path, capsys, text, words):
    path = tmp_path / "p.toml"
    path.write_text(text)
    code = cli.main(["run", str(path), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.strip().count("\n") == 0, err[:500]


def test_a_deep_set_value_is_one_line(capsys):
    code = cli.main(["run", "quickstart", "--dry-run", "--set",
                     "model.kwargs={ a = " + "[" * 3000 + "]" * 3000 + " }"])
    err = capsys.readouterr().err
    assert code == 2 and "nested" in err and err.strip().count("\n") == 0, err[:500]


def test_readers_of_records_and_preset_lists_skip_deep_files(tmp_path):
    (tmp_path / "config.toml").write_text(DEEP_ARRAY)
    assert history.read_config(tmp_path, events=[]) == {}
    assert presets.names_code(tmp_path / "config.toml") == []


def test_parse_toml_keeps_sane_nesting():
    assert safeio.parse_toml("a = [[1], [2]]\n[t.u]\nv = { w = 1 }\n")["t"]["u"]["v"]["w"] == 1
