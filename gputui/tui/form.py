"""The set-up form's model: which fields it shows and how its text becomes a RunConfig.

Every value goes through the config module exactly as a CLI ``--set table.key=value`` does
(``parse_assignment`` then ``apply_overrides``, then ``gputui.plan``'s rules), so the form
shows the CLI's own one-line ``ConfigError`` messages. Pure Python: no Textual, tested
directly. The rules need the devices (the app passes those of its last discovery) and never
the disk; what the config names on disk is :func:`files_problem`'s, checked apart.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any

from gputui import plan
from gputui.core.config import (ConfigError, RunConfig, apply_overrides, from_dict,
                           override_origins, parse_assignment)
from gputui.core.config_schema import SECTIONS
from gputui.core.devices import Device

SOURCE = "form"


@dataclass(frozen=True)
class FieldSpec:
    """One form field: its config key, its label and the widget that edits it."""

    key: str  # "table.key"
    label: str
    kind: str  # "input" | "select" | "switch"

    @property
    def table(self) -> str:
        """The TOML table: 'optim' for optim.lr."""
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        """The key within the table: 'lr' for optim.lr."""
        return self.key.split(".", 1)[1]

    @property
    def dom_id(self) -> str:
        """A DOM id for the field's widget: 'f-optim-lr'."""
        return "f-" + self.key.replace(".", "-").replace("_", "-")

    def metadata(self) -> dict:
        """The config field's metadata (help, choices, bounds)."""
        for f in dataclasses.fields(SECTIONS[self.table]):
            if f.name == self.name:
                return dict(f.metadata)
        raise KeyError(self.key)

    def choices(self) -> tuple[str, ...]:
        """The allowed values of a select field."""
        return tuple(self.metadata().get("choices", ()))

    def help(self) -> str:
        """The field's documentation, from the config schema."""
        return self.metadata().get("help", "")


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("model.name", "Model", "select"),
    FieldSpec("data.name", "Dataset", "select"),
    FieldSpec("data.source", "Data source", "select"),
    FieldSpec("data.root", "Data root", "input"),
    FieldSpec("data.path", "Text file", "input"),
    FieldSpec("run.epochs", "Epochs", "input"),
    FieldSpec("optim.batch_size", "Batch size", "input"),
    FieldSpec("optim.lr", "Learning rate", "input"),
    FieldSpec("optim.name", "Optimizer", "select"),
    FieldSpec("optim.weight_decay", "Weight decay", "input"),
    FieldSpec("optim.schedule", "LR schedule", "select"),
    FieldSpec("optim.warmup_steps", "Warm-up steps", "input"),
    FieldSpec("optim.clip_grad_norm", "Clip grad norm", "input"),
    FieldSpec("optim.micro_batches", "Micro-batches", "input"),
    FieldSpec("strategy.pipeline_chunks", "Pipeline chunks", "input"),
    FieldSpec("strategy.schedule", "Pipeline schedule", "select"),
    FieldSpec("strategy.tp_size", "TP group size", "input"),
    FieldSpec("parallel.dp_replicate", "Mesh: dp replicas", "input"),
    FieldSpec("parallel.dp_shard", "Mesh: dp shards", "input"),
    FieldSpec("parallel.tp", "Mesh: tensor parallel", "input"),
    FieldSpec("parallel.cp", "Mesh: context parallel", "input"),
    FieldSpec("parallel.pp", "Mesh: pipeline stages", "input"),
    FieldSpec("parallel.zero", "ZeRO stage", "input"),
    FieldSpec("parallel.ac", "Activation checkpointing", "select"),
    FieldSpec("strategy.stages_per_rank", "Stages per rank", "input"),
    FieldSpec("data.context", "Context tokens", "input"),
    FieldSpec("run.precision", "Precision", "select"),
    FieldSpec("run.seed", "Seed", "input"),
    FieldSpec("data.train_size", "Train size", "input"),
    FieldSpec("run.log_every", "Log every", "input"),
    FieldSpec("optim.scale_with_devices", "Scale batch & lr with devices", "switch"),
)
FIELD_BY_KEY = {f.key: f for f in FIELDS}
# a select the config's code replaces: model.name under model.factory, data.name under
# data.factory (the run ignores it; the select shows the code and is disabled)
FACTORY_OF = {"model.name": "model.factory", "data.name": "data.factory"}


def select_options(cfg: RunConfig, spec: FieldSpec) -> tuple[list[tuple[str, str]], bool]:
    """A select's (label, value) options for ``cfg``, and whether it is disabled: the one
    option naming the code when a factory replaces it, else the field's choices."""
    factory = FACTORY_OF.get(spec.key)
    code = current_value(cfg, factory) if factory else ""
    if code:
        return [(f"{code} ({factory})", current_value(cfg, spec.key))], True
    return [(c, c) for c in spec.choices()], False


def current_value(cfg: RunConfig, key: str) -> Any:
    """The config's value for ``table.key``."""
    table, name = key.split(".", 1)
    return getattr(getattr(cfg, table), name)


def empty_meaning(key: str) -> str:
    """What an empty box means for fields whose default is 'nothing' (shown as the box's
    placeholder): 'all' for a train size of 0, the cache folder for an empty data root."""
    if key == "data.train_size":
        from gputui.core.datafiles import SYNTHETIC_SIZES

        return f"all (synthetic: {SYNTHETIC_SIZES['train']})"
    if key == "data.path":
        return "text data: a file or a folder"
    if key == "data.root":
        from pathlib import Path

        from gputui.core.config_schema import default_data_root

        root, home = default_data_root(), str(Path.home())
        return "~" + root[len(home):] if root.startswith(home + "/") else root
    return ""


def field_text(key: str, value: Any) -> str:
    """A value as its box shows it: empty where the default means 'all' or 'the default'."""
    if empty_meaning(key) and value in (0, ""):
        return ""
    return value_text(value)


def value_text(value: Any) -> str:
    """How a value appears in an input box (floats without a trailing '.0' noise)."""
    if isinstance(value, float):
        return repr(value) if value != int(value) or abs(value) >= 1e16 else f"{value:.1f}"
    return str(value)


def parse_field(key: str, raw: Any) -> Any:
    """Text from an input becomes a value exactly as ``--set key=text`` would; others pass."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if empty_meaning(key) and text.lower() in ("", "all", "default"):
        return 0 if key == "data.train_size" else ""
    if not text:
        raise ConfigError(f"{SOURCE}: {key} needs a value; e.g. {key} = "
                          f"{value_text(current_value(RunConfig(), key))}")
    return parse_assignment(f"{key}={text}")[1]


def check_field(key: str, raw: Any) -> str | None:
    """The one-line error for this field's value, or None when it is valid on its own (the
    check ``apply_overrides`` makes of each override before it builds the whole config)."""
    try:
        table, _, name = key.partition(".")
        from_dict({table: {name: parse_field(key, raw)}}, source=SOURCE)
    except ConfigError as exc:
        return str(exc)
    return None


def parse_extra(text: str) -> list[tuple[str, str, Any]]:
    """'data.test_size=500 optim.momentum=0.9' -> overrides, each sourced as the CLI does."""
    try:
        items = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--set {text}: {exc}; check the quotes") from None
    out = []
    for item in items:
        key, value = parse_assignment(item)
        out.append((f"--set {item}", key, value))
    return out


@dataclass
class FormResult:
    """What the form's current text amounts to."""

    config: RunConfig | None  # None when something is wrong
    field_errors: dict[str, str] = field(default_factory=dict)  # key -> message
    error: str = ""  # a cross-field or extra-override problem, one line
    origins: dict[str, str] = field(default_factory=dict)  # key -> the source that set it

    @property
    def ok(self) -> bool:
        """True when the form amounts to a valid config."""
        return self.config is not None


def build(base: RunConfig, values: dict[str, Any], devices_spec: str, strategy: str,
          extra: str = "", check: bool = True, devices: list[Device] | None = None,
          files: bool = True) -> FormResult:
    """Validate every field, then (``check``) the whole config as the CLI does: the
    cross-field rules against ``devices`` (the app passes those of its last discovery; None:
    resolved here, which asks NVML when the spec names GPUs), then, with ``files``, what it
    names on disk (:func:`files_problem`)."""
    errors: dict[str, str] = {}
    overrides: list[tuple[str, str, Any]] = []
    for key, raw in values.items():
        message = check_field(key, raw)
        if message:
            errors[key] = message
        else:
            overrides.append((SOURCE, key, parse_field(key, raw)))
    try:
        overrides += parse_extra(extra)
    except ConfigError as exc:
        return FormResult(None, errors, str(exc))
    if errors:
        return FormResult(None, errors)
    overrides += [(SOURCE, "devices.spec", devices_spec), (SOURCE, "strategy.name", strategy)]
    origins = override_origins(overrides)
    try:
        cfg = apply_overrides(base, overrides)
        if check and devices is None:  # discovery, then the rules
            from gputui.runs.prepare import prepare

            prepare(cfg, SOURCE, origins, files=False)
        elif check and devices is not None:
            plan.validate(cfg, devices, SOURCE, origins)
    except ConfigError as exc:
        return FormResult(None, errors, str(exc), origins)
    if check and files:
        problem = files_problem(cfg, origins)
        if problem:
            return FormResult(None, errors, problem, origins)
    return FormResult(cfg, origins=origins)


def files_problem(cfg: RunConfig, origins: dict[str, str] | None = None) -> str | None:
    """What the disk says of the files the config names (factories, the checkpoint to resume,
    the dataset), as the CLI says it before a run, or None. Reads the disk: the app calls it
    off the UI thread, and at Start."""
    from gputui.runs.prepare import check_disk

    try:
        check_disk(cfg, SOURCE, origins)
    except ConfigError as exc:
        return str(exc)
    return None


def reads_disk(cfg: RunConfig) -> bool:
    """True when :func:`files_problem` would read the disk for this config: a factory, a
    checkpoint to resume, or a dataset other than the embedded synthetic one."""
    return bool(cfg.model.factory or cfg.data.factory or cfg.run.resume_from
                or cfg.data.name != "synthetic")
