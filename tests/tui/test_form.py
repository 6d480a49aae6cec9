"""The form model says exactly what the CLI says about the same values."""

from __future__ import annotations

import pytest

from gputui.core.config import ConfigError, RunConfig, apply_overrides, parse_assignment
from gputui.tui.form import (FIELDS, build, check_field, empty_meaning, field_text, parse_extra,
                             parse_field)


def cli_message(key: str, text: str) -> str:
    """The message `gputui run --set key=text` gives, minus its source prefix."""
    _, value = parse_assignment(f"{key}={text}")
    with pytest.raises(ConfigError) as info:
        apply_overrides(RunConfig(), [(f"--set {key}={text}", key, value)])
    return str(info.value).split(": ", 1)[1]


@pytest.mark.parametrize("key,text", [
    ("optim.lr", "abc"), ("optim.lr", "-1"), ("run.epochs", "0"), ("run.epochs", "2.5"),
    ("optim.batch_size", "x"), ("optim.micro_batches", "0"), ("run.seed", "-3"),
    ("data.train_size", "-1"), ("run.log_every", "0"),
])
def test_field_errors_are_the_cli_messages(key, text):
    message = check_field(key, text)
    assert message == f"form: {cli_message(key, text)}"


def test_every_field_is_a_real_config_key():
    cfg = RunConfig()
    for spec in FIELDS:
        assert hasattr(getattr(cfg, spec.table), spec.name), spec.key
        assert spec.help()
        if spec.kind == "select":
            assert spec.choices()


def test_valid_form_builds_the_config():
    values = {"run.epochs": "5", "optim.lr": "0.2", "model.name": "mlp",
              "optim.scale_with_devices": True}
    result = build(RunConfig(), values, "cpu*2", "scratch", "data.test_size=500")
    assert result.ok, result
    cfg = result.config
    assert (cfg.run.epochs, cfg.optim.lr, cfg.model.name) == (5, 0.2, "mlp")
    assert cfg.optim.scale_with_devices and cfg.data.test_size == 500
    assert (cfg.devices.spec, cfg.strategy.name) == ("cpu*2", "scratch")


def test_the_form_sets_a_transformer_run_with_adamw_a_schedule_and_pipeline():
    values = {"model.name": "gpt", "data.name": "pystdlib", "optim.name": "adamw",
              "optim.weight_decay": "0.1", "optim.schedule": "cosine",
              "optim.warmup_steps": "4", "optim.clip_grad_norm": "1.0",
              "strategy.pipeline_chunks": "2", "strategy.schedule": "gpipe",
              "data.context": "32", "optim.batch_size": "8"}
    result = build(RunConfig(), values, "cpu*2", "pp")
    assert result.ok, result
    o, st = result.config.optim, result.config.strategy
    assert (o.name, o.weight_decay, o.schedule, o.warmup_steps, o.clip_grad_norm) == \
        ("adamw", 0.1, "cosine", 4, 1.0)
    assert (st.name, st.pipeline_chunks, st.schedule, result.config.data.context) == \
        ("pp", 2, "gpipe", 32)


def test_cross_field_problem_is_reported_not_per_field():
    result = build(RunConfig(), {"run.precision": "fp16"}, "cpu*2", "scratch")
    assert not result.ok and not result.field_errors
    assert "needs CUDA devices" in result.error


def test_extra_overrides_use_the_cli_source_and_messages():
    assert parse_extra("optim.momentum=0.9 data.name=mnist") == [
        ("--set optim.momentum=0.9", "optim.momentum", 0.9),
        ("--set data.name=mnist", "data.name", "mnist")]
    result = build(RunConfig(), {}, "cpu*2", "scratch", "optim.nope=1")
    assert result.error.startswith("--set optim.nope=1: unknown key 'optim.nope'")


def test_defaults_that_mean_all_or_default_show_as_what_they_mean(tmp_path):
    assert field_text("data.train_size", 0) == "" and empty_meaning("data.train_size") == (
        "all (synthetic: 12000)")
    assert field_text("data.train_size", 500) == "500"
    assert field_text("data.root", "") == "" and empty_meaning("data.root").endswith(
        "gputui/data")
    for text in ("", "all", " All "):
        assert parse_field("data.train_size", text) == 0
    assert parse_field("data.root", "") == ""
    result = build(RunConfig(), {"data.train_size": "", "data.root": str(tmp_path),
                                 "data.source": "test-split"}, "cpu", "single")
    assert result.ok, result
    assert (result.config.data.train_size, result.config.data.root,
            result.config.data.source) == (0, str(tmp_path), "test-split")
    assert check_field("run.epochs", "") == ("form: run.epochs needs a value; e.g. "
                                                          "run.epochs = 2")
