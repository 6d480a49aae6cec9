"""RunConfig: load a TOML preset, coerce and check each value, apply overrides, serialise.

Precedence is CLI > preset > defaults. Every problem is raised as :class:`ConfigError` whose
message is one line naming the source (file or flag), the key and the fix. The rules that
join several keys, or a key and the devices, are ``gputui.plan``'s: this module asks neither
the hardware nor the strategies.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gputui.core.config_schema import (
    SECTIONS, TEXT_DATASETS, DataSection, DebugSection, DevicesSection, DistSection,
    ModelSection, OptimSection, ParallelSection, RunSection, StrategySection, TelemetrySection,
)
from gputui.core.errors import UserError


class ConfigError(UserError, ValueError):
    """A bad preset, override or combination; the message is one line for the user."""

    def __init__(self, message: object = ""):
        # Messages echo the user's keys and values: escape control characters, so a key holding
        # a newline still gives one line.
        super().__init__(str(message).translate(_ESCAPES))


_ESCAPES = {c: repr(chr(c))[1:-1] for c in [*range(32), 127]}


@dataclass(frozen=True)
class RunConfig:
    """The whole resolved configuration of a run: one attribute per TOML table."""

    run: RunSection = dataclasses.field(default_factory=RunSection)
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    optim: OptimSection = dataclasses.field(default_factory=OptimSection)
    devices: DevicesSection = dataclasses.field(default_factory=DevicesSection)
    strategy: StrategySection = dataclasses.field(default_factory=StrategySection)
    parallel: ParallelSection = dataclasses.field(default_factory=ParallelSection)
    dist: DistSection = dataclasses.field(default_factory=DistSection)
    telemetry: TelemetrySection = dataclasses.field(default_factory=TelemetrySection)
    debug: DebugSection = dataclasses.field(default_factory=DebugSection)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict, the shape of the TOML file."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def to_toml(self) -> str:
        """The config as a TOML document that ``load_preset`` reads back unchanged."""
        return tomli_w.dumps(self.to_dict())

    def replace(self, **changes: dict[str, Any]) -> RunConfig:
        """A copy with some fields of some tables changed: ``cfg.replace(optim={"lr": 0.2})``.
        Only the changed values are checked: the rest were checked when this one was made."""
        return self._with({table: _checked("replace", table, values)
                           for table, values in changes.items()})

    def _with(self, checked: dict[str, dict[str, Any]]) -> RunConfig:
        """A copy with values already checked (``_checked``) put into their tables."""
        return dataclasses.replace(self, **{
            table: dataclasses.replace(getattr(self, table), **values)
            for table, values in checked.items()})


def task_of(cfg: RunConfig) -> str:
    """'lm' (language modelling: loss, perplexity, tokens/s) for the text datasets, else
    'classify' (accuracy)."""
    return "lm" if cfg.data.name in TEXT_DATASETS and not cfg.data.factory else "classify"


def effective_batch_size(cfg: RunConfig, n_devices: int) -> int:
    """The global batch size after ``optim.scale_with_devices``."""
    return cfg.optim.batch_size * (n_devices if cfg.optim.scale_with_devices else 1)


def effective_lr(cfg: RunConfig, n_devices: int) -> float:
    """The learning rate after ``optim.scale_with_devices``."""
    return cfg.optim.lr * (n_devices if cfg.optim.scale_with_devices else 1)


# ---------------------------------------------------------------- field checks

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               list: "a list", dict: "a table (e.g. { width = 64 })"}


def _coerce(source: str, key: str, value: Any, f: dataclasses.Field) -> Any:
    """Check one value against its field's type and rules; return it normalised."""
    ftype = {"int": int, "float": float, "str": str, "bool": bool, "list": list,
             "dict": dict}[str(f.type)]
    ok = isinstance(value, ftype) and not (ftype is int and isinstance(value, bool))
    if ftype is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{source}: {key} must be {_TYPE_NAMES[ftype]}, got {value!r}; "
                          f"fix the value (e.g. {key} = {_example(f)})")
    meta = f.metadata
    if "choices" in meta and value not in meta["choices"]:
        choices = ", ".join(str(c) for c in meta["choices"])
        raise ConfigError(f"{source}: {key} must be one of {choices}; got {value!r}")
    if ftype in (int, float):
        _check_number(source, key, value, meta, f)
    if ftype is list and "items" in meta:
        item_type, rules = meta["items"]
        for i, item in enumerate(value):
            where = f"{key}[{i}]"
            if isinstance(item, int) and not isinstance(item, bool) and item_type is float:
                item = float(item)
            if not isinstance(item, item_type) or isinstance(item, bool):
                raise ConfigError(f"{source}: {where} must be {_TYPE_NAMES[item_type]}, got "
                                  f"{item!r}; fix the value (e.g. {key} = {_example(f)})")
            _check_number(source, where, item, rules, f, key)
    if ftype is list:
        value = list(value)
    if ftype is dict:
        value = dict(value)
    problem = meta["check"](value) if "check" in meta else None
    if problem:
        raise ConfigError(f"{source}: {problem}")
    if meta.get("code") and value:
        from gputui.core.usercode import spec_problem  # torch-free, runs no code

        problem = spec_problem(value)
        if problem:
            raise ConfigError(f"{source}: {key} = {value!r}: {problem}")
    return value


def _check_number(source: str, key: str, value: int | float, rules: Any,
                  f: dataclasses.Field, field_key: str = "") -> None:
    """A number against its rules (min, max, gt); NaN and infinities are never a setting.
    (The example in the message is written only when there is a message: the app checks
    every field on every keystroke.)"""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}; fix the "
                          f"value (e.g. {field_key or key} = {_example(f)})")
    if "min" in rules and value < rules["min"]:
        raise ConfigError(f"{source}: {key} must be at least {rules['min']}, got {value!r}")
    if "max" in rules and value > rules["max"]:
        raise ConfigError(f"{source}: {key} must be at most {rules['max']}, got {value!r}")
    if "gt" in rules and value <= rules["gt"]:
        raise ConfigError(f"{source}: {key} must be greater than {rules['gt']}, got {value!r}")


def _example(f: dataclasses.Field) -> str:
    default = f.default_factory() if callable(f.default_factory) else f.default
    return tomli_w.dumps({"x": default}).strip()[4:]


def _suggest(word: str, known: list[str], table: str = "") -> str:
    """The close match (a key named with its table: 'data.train_size', as --set takes it),
    else every known one."""
    close = difflib.get_close_matches(word, known, n=1)
    if close:
        return f"did you mean '{table + '.' if table else ''}{close[0]}'?"
    return f"known keys: {', '.join(known)}"


def _checked(source: str, table: str, values: Any) -> dict[str, Any]:
    """The values of one table, each checked and normalised (``_coerce``); unknown tables and
    keys refused with the closest known name."""
    if table not in SECTIONS:
        raise ConfigError(f"{source}: unknown table [{table}]; "
                          f"{_suggest(table, list(SECTIONS))}")
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: '{table}' must be a table ([{table}]), got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[table])}
    out = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"{source}: unknown key '{table}.{key}'; "
                              f"{_suggest(key, list(fields), table)}")
        out[key] = _coerce(source, f"{table}.{key}", value, fields[key])
    return out


def from_dict(data: dict[str, Any], source: str = "config") -> RunConfig:
    """Build a RunConfig from a TOML-shaped dict, refusing unknown tables and keys and values
    of the wrong type or out of bounds (each value on its own; see ``gputui.plan``)."""
    return RunConfig()._with({table: _checked(source, table, values)
                              for table, values in data.items()})


def from_record(data: Any) -> RunConfig:
    """The config a run record holds (its RunStarted event), as typed as a record written by
    an older gputui allows: every value that still checks is kept, a table, key or value this
    version no longer knows is left at its default (a record is read, never refused)."""
    tables: dict[str, dict[str, Any]] = {}
    for table, values in (data.items() if isinstance(data, dict) else ()):
        for key, value in (values.items() if isinstance(values, dict) else ()):
            try:
                checked = _checked("record", table, {key: value})
            except ConfigError:
                continue
            tables.setdefault(table, {}).update(checked)
    return RunConfig()._with(tables)


def load_preset(path: str | Path, overrides: Sequence[tuple[str, str, Any]] = (),
                what: str = "preset") -> RunConfig:
    """Read a preset file and apply ``overrides`` (source, "table.key", value), CLI last.
    ``what`` the file is, in messages: a "preset", or a resumed run's "run config".

    Each value is checked; the cross-field rules are ``gputui.plan.validate``'s."""
    from gputui.core import safeio

    path = Path(path)
    try:  # a regular file within a size bound: a fifo or /dev/zero is refused, never read
        text = safeio.read_text(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise ConfigError(f"{path}: is a link to {os.readlink(path)}, which does not "
                              f"exist; fix or remove the link") from None
        raise ConfigError(f"{path}: no such {what} file" + (
            "; give a path or a name from `gputui presets`" if what == "preset" else "")) \
            from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({safeio.reason(exc)})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: is not UTF-8 text, so not a TOML {what}" + (
            "; give a .toml file" if what == "preset" else
            "; the file is damaged: restore it from a copy")) from None
    try:
        data = safeio.parse_toml(text)
    except safeio.BadToml as exc:
        if exc.too_deep:
            raise ConfigError(f"{path}: {exc}; flatten it") from None
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax") from None
    cfg = anchor_code_paths(from_dict(data, source=str(path)), path.parent)
    return apply_overrides(cfg, overrides)


def anchor_code_paths(cfg: RunConfig, folder: Path) -> RunConfig:
    """A preset's relative factory file (or image folder) is found beside the preset: it is
    made absolute when it exists there, so the run (and its record, and a resume) finds it from
    any folder. Paths not found there stay relative to the folder gputui runs in."""
    from gputui.core.usercode import CODE_KEYS, parse

    changes: dict[str, dict[str, str]] = {}
    for key in CODE_KEYS:
        table, name = key.split(".")
        spec = getattr(getattr(cfg, table), name)
        try:
            f = parse(spec) if spec else None
        except ValueError:
            continue  # the checks say what is wrong with it
        if f is None or f.kind not in ("file", "imagefolder") or Path(f.target).is_absolute():
            continue
        there = folder / Path(f.target).expanduser()
        if there.exists():
            tail = f":{f.function}" if f.kind == "file" else ""
            head = "imagefolder:" if f.kind == "imagefolder" else ""
            changes.setdefault(table, {})[name] = f"{head}{there.resolve()}{tail}"
    return cfg.replace(**changes) if changes else cfg


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse ``table.key=value`` (value as TOML, bare words as strings)."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected table.key=value, e.g. --set optim.lr=0.2")
    key, raw = (part.strip() for part in text.split("=", 1))
    if key.count(".") != 1:
        raise ConfigError(f"--set {text}: the key must be table.key, e.g. optim.lr")
    from gputui.core import safeio

    try:
        value = safeio.parse_toml(f"v = {raw}")["v"]
    except safeio.BadToml as exc:
        if exc.too_deep:
            raise ConfigError(f"--set {text[:80]}: not a TOML value ({exc})") from None
        value = raw  # a bare word such as synthetic or cpu*2
    return key, value


def apply_overrides(cfg: RunConfig,
                    overrides: Sequence[tuple[str, str, Any]] = ()) -> RunConfig:
    """Apply (source, "table.key", value) overrides in order; a bad value is blamed on its
    source. Only the overridden values are checked: ``cfg``'s own were when it was made."""
    changes: dict[str, dict[str, Any]] = {}
    for source, key, value in overrides:  # each value checked once, blamed on its source
        table, _, name = key.partition(".")
        changes.setdefault(table, {}).update(_checked(source, table, {name: value}))
    return cfg._with(changes) if changes else cfg


def override_origins(overrides: Sequence[tuple[str, str, Any]] = ()) -> dict[str, str]:
    """"table.key" -> the source of the override that set it last ("--devices", "--set
    optim.lr=0.2"): what ``gputui.plan`` blames a broken rule on."""
    return {key: source for source, key, _ in overrides}


def field_help(table: str, key: str) -> str:
    """The documentation of one field (for help text and the TUI)."""
    for f in dataclasses.fields(SECTIONS[table]):
        if f.name == key:
            return f.metadata.get("help", "")
    raise KeyError(f"{table}.{key}")
