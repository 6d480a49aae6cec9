"""Config: presets load, overrides apply in order, and bad input gets the exact one-line error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gputui.core.config import (ConfigError, RunConfig, apply_overrides, field_help, from_dict,
                           load_preset, parse_assignment)
from gputui.core import registry
from gputui.core.config_schema import SECTIONS
from gputui.core.presets import list_presets, resolve_preset
from gputui.hw.discovery import discover_gpus
from gputui.runs.prepare import load_checked

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((ROOT / "tests" / "data" / "bad_presets").glob("*.toml"))


def test_every_shipped_preset_loads():
    presets = list((ROOT / "presets").glob("*.toml"))
    assert len(presets) >= 5
    for path in presets:
        # the rules, not this machine's datasets: a missing one is left to data.download
        cfg = load_checked(path, [("t", "data.download", True)]).config
        assert cfg.run.epochs >= 1, path
        # and each runs on the embedded dataset, as the README promises: the image presets
        # on the synthetic set, the text ones on pystdlib (this Python's own source)
        if cfg.model.name == "gpt":
            assert cfg.data.name == "pystdlib", path
        else:
            load_checked(path, [("--set", "data.name", "synthetic")])


def test_quickstart_is_what_the_readme_says():
    cfg = load_preset(resolve_preset("quickstart"))
    assert (cfg.data.name, cfg.model.name, cfg.strategy.name, cfg.devices.spec) == (
        "synthetic", "lenet", "scratch", "cpu*2")


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_preset_gives_exact_error(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    gpus, reason = discover_gpus()
    if "{nogpu}" in first and gpus:
        pytest.skip("this machine has GPUs")
    expected = first[len("# expect: "):].format(
        path=path, nogpu=reason, strategies=", ".join(registry.names()))
    with pytest.raises(ConfigError) as info:
        load_checked(path)
    message = str(info.value)
    assert "\n" not in message
    assert message == expected


def test_overrides_beat_the_preset_and_later_beat_earlier(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("[optim]\nlr = 0.3\nbatch_size = 64\n")
    cfg = load_preset(p, [("--set", "optim.lr", 0.5), ("--lr", "optim.lr", 0.7)])
    assert cfg.optim.lr == 0.7
    assert cfg.optim.batch_size == 64  # from the preset
    assert cfg.run.epochs == RunConfig().run.epochs  # the default


def test_override_errors_name_the_flag(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("")
    with pytest.raises(ConfigError, match=r"^--set optim.lr=x: optim.lr must be a number"):
        load_preset(p, [("--set optim.lr=x", "optim.lr", "x")])
    with pytest.raises(ConfigError, match=r"^--epochs: run.epochs must be at least 1, got -1$"):
        load_preset(p, [("--epochs", "run.epochs", -1)])


@pytest.mark.parametrize("text,key,value", [
    ("optim.lr=0.2", "optim.lr", 0.2), ("run.epochs=3", "run.epochs", 3),
    ("data.name=synthetic", "data.name", "synthetic"), ("devices.spec=cpu*2", "devices.spec", "cpu*2"),
    ("strategy.split_weights=[0.8, 0.2]", "strategy.split_weights", [0.8, 0.2]),
    ("optim.scale_with_devices=true", "optim.scale_with_devices", True),
    ("devices.spec=0,2", "devices.spec", "0,2"),
])
def test_parse_assignment(text, key, value):
    assert parse_assignment(text) == (key, value)


@pytest.mark.parametrize("text,error", [
    ("optim.lr", "expected table.key=value"), ("lr=0.1", "the key must be table.key"),
])
def test_parse_assignment_errors(text, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        parse_assignment(text)


def test_toml_round_trip_is_exact(tmp_path):
    cfg = apply_overrides(RunConfig(), [("t", "strategy.name", "scratch"),
                                        ("t", "devices.spec", "cpu*3"),
                                        ("t", "strategy.split_weights", [0.5, 0.25, 0.25])])
    p = tmp_path / "saved.toml"
    p.write_text(cfg.to_toml())
    assert load_preset(p) == cfg
    assert from_dict(cfg.to_dict()) == cfg


def test_every_field_is_documented():
    import dataclasses

    for table, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert len(field_help(table, f.name)) > 15, f"{table}.{f.name} lacks help"
            assert f.type in ("int", "float", "str", "bool", "list", "dict"), f.type


def test_preset_names_resolve_and_unknown_names_are_listed():
    assert resolve_preset("quickstart").name == "quickstart.toml"
    assert "quickstart" in [p.stem for p in list_presets()]
    with pytest.raises(ConfigError, match="no such preset file or preset name; known presets:"):
        resolve_preset("nope")


def test_the_users_presets_folder_is_never_the_projects_own(tmp_path, monkeypatch):
    """`tune` (and the app's Save as preset) wrote into the repository's presets/ when run
    from the repository: there the user's folder is ~/.config/gputui/presets."""
    from gputui.core.presets import PACKAGE_PRESETS, preset_dirs, resolve_preset, user_presets_dir

    monkeypatch.delenv("GPUTUI_PRESETS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(PACKAGE_PRESETS.parent)  # the repository
    mine = tmp_path / "config" / "gputui" / "presets"
    assert user_presets_dir() == mine
    mine.mkdir(parents=True)
    (mine / "gpt-tiny-tuned.toml").write_text('[run]\nname = "t"\n')
    assert preset_dirs()[0] == mine and PACKAGE_PRESETS.resolve() in [
        d.resolve() for d in preset_dirs()]
    assert resolve_preset("gpt-tiny-tuned") == mine / "gpt-tiny-tuned.toml"
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert user_presets_dir() == Path("presets")  # a project of the user's own
    monkeypatch.setenv("GPUTUI_PRESETS_DIR", str(tmp_path / "chosen"))
    assert user_presets_dir() == tmp_path / "chosen"


def test_a_run_with_two_flags_checks_each_value_once(tmp_path, monkeypatch):
    """The CLI's way from a preset and two flags to the config a run starts from checks each
    value once: no dict round trip re-checks the whole config after every change (it checked
    a run with two flags four times)."""
    from collections import Counter

    from gputui.cli import build_parser, resolve_config
    from gputui.core import config

    p = tmp_path / "p.toml"
    p.write_text('[run]\nepochs = 1\n[data]\nname = "synthetic"\n[devices]\nspec = "cpu"\n')
    checked: Counter = Counter()
    coerce = config._coerce

    def counting(source, key, value, f):
        checked[key] += 1
        return coerce(source, key, value, f)

    monkeypatch.setattr(config, "_coerce", counting)
    args = build_parser().parse_args(["run", str(p), "--set", "optim.lr=0.2", "--epochs", "2"])
    cfg = resolve_config(args).config
    assert (cfg.optim.lr, cfg.run.epochs, cfg.data.name) == (0.2, 2, "synthetic")
    assert checked == {"run.epochs": 2, "data.name": 1, "devices.spec": 1, "optim.lr": 1}
    # replace checks what it changes, and only that
    checked.clear()
    assert cfg.replace(optim={"lr": 0.3}).optim.lr == 0.3 and checked == {"optim.lr": 1}
    with pytest.raises(ConfigError, match=r"^replace: optim.lr must be greater than 0"):
        cfg.replace(optim={"lr": -1.0})
