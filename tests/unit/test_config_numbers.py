"""Every numeric key, scalar or list element, refuses NaN, infinities and values outside what
the key can mean, naming the key: through a preset file and through --set alike."""

from __future__ import annotations

import dataclasses

import pytest

from gputui.core.config import ConfigError, from_dict
from gputui.core.config_schema import SECTIONS

NUMERIC = [(t, f.name, f.type) for t, cls in SECTIONS.items() for f in dataclasses.fields(cls)
           if str(f.type) in ("int", "float")]


@pytest.mark.parametrize("table,key,kind", NUMERIC)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1.7e308,
                                   10**30, -10**30])
def test_every_numeric_key_refuses_absurd_values(table, key, kind, value):
    if kind == "int" and isinstance(value, float):
        value_ok_type = False
    else:
        value_ok_type = True
    with pytest.raises(ConfigError) as info:
        from_dict({table: {key: value}}, source="p.toml")
    msg = str(info.value)
    assert f"{table}.{key}" in msg and "\n" not in msg
    if value_ok_type:
        assert "must be" in msg


@pytest.mark.parametrize("key,value,words", [
    ("split_weights", [1.0, float("nan")], "strategy.split_weights[1] must be a finite number"),
    ("split_weights", [float("inf"), 1], "strategy.split_weights[0] must be a finite number"),
    ("split_weights", [1.7e308, 1.0], "strategy.split_weights[0] must be at most"),
    ("split_weights", [0.5, 0], "strategy.split_weights[1] must be greater than 0"),
    ("split_weights", [0.5, "x"], "strategy.split_weights[1] must be a number"),
    ("split_weights", [0.5, True], "strategy.split_weights[1] must be a number"),
    ("split_points", [1.5], "strategy.split_points[0] must be an integer"),
    ("split_points", [10**30], "strategy.split_points[0] must be at most"),
    ("split_points", [-1], "strategy.split_points[0] must be at least 1"),
])
def test_list_elements_are_checked_one_by_one(key, value, words):
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        from_dict({"strategy": {key: value}}, source="p.toml")


def test_sane_lists_pass():
    cfg = from_dict({"strategy": {"split_weights": [0.8, 1], "split_points": [3]}})
    assert cfg.strategy.split_weights == [0.8, 1.0] or cfg.strategy.split_weights == [0.8, 1]
    assert cfg.strategy.split_points == [3]


def test_a_set_flag_with_nan_in_a_list_is_one_line(capsys):
    from gputui import cli

    code = cli.main(["run", "quickstart", "--dry-run", "--set",
                     "strategy.split_weights=[1.0, nan]"])
    err = capsys.readouterr().err
    assert code == 2 and "strategy.split_weights[1]" in err and err.strip().count("\n") == 0
