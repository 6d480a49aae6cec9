"""RunConfig: load a TOML preset, apply overrides, validate, serialise.

Precedence is CLI > preset > defaults. Every problem is raised as :class:`ConfigError` whose
message is one line naming the source (file or flag), the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gputui.config_schema import (  # noqa: F401 - effective_*: also this module's API
    DataSection, DebugSection, DevicesSection, DistSection, ModelSection, OptimSection, RunSection,
    SECTIONS, StrategySection, TelemetrySection, effective_batch_size, effective_lr,
)


class ConfigError(ValueError):
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
    dist: DistSection = dataclasses.field(default_factory=DistSection)
    telemetry: TelemetrySection = dataclasses.field(default_factory=TelemetrySection)
    debug: DebugSection = dataclasses.field(default_factory=DebugSection)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict, the shape of the TOML file."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def to_toml(self) -> str:
        """The config as a TOML document that ``load_preset`` reads back unchanged."""
        return tomli_w.dumps(self.to_dict())

    def replace(self, **changes: dict[str, Any]) -> "RunConfig":
        """A copy with some fields of some tables changed: ``cfg.replace(optim={"lr": 0.2})``."""
        return from_dict(_merge(self.to_dict(), changes), source="replace", check=False)


def _merge(base: dict, changes: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for table, values in changes.items():
        out.setdefault(table, {}).update(values)
    return out


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
    if ftype is float and value != value:  # NaN passes every min/max comparison
        raise ConfigError(f"{source}: {key} must be a number, got nan; fix the value "
                          f"(e.g. {key} = {_example(f)})")
    meta = f.metadata
    if "choices" in meta and value not in meta["choices"]:
        choices = ", ".join(meta["choices"])
        raise ConfigError(f"{source}: {key} must be one of {choices}; got {value!r}")
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{source}: {key} must be at least {meta['min']}, got {value!r}")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{source}: {key} must be at most {meta['max']}, got {value!r}")
    if "gt" in meta and value <= meta["gt"]:
        raise ConfigError(f"{source}: {key} must be greater than {meta['gt']}, got {value!r}")
    if ftype is list:
        value = list(value)
    if ftype is dict:
        value = dict(value)
    if meta.get("code") and value:
        from gputui.usercode import spec_problem  # torch-free, runs no code

        problem = spec_problem(value)
        if problem:
            raise ConfigError(f"{source}: {key} = {value!r}: {problem}")
    return value


def _example(f: dataclasses.Field) -> str:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return tomli_w.dumps({"x": default}).strip()[4:]


def _suggest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"known keys: {', '.join(known)}"


def from_dict(data: dict[str, Any], source: str = "config", check: bool = True) -> RunConfig:
    """Build a RunConfig from a TOML-shaped dict, refusing unknown tables and keys."""
    tables: dict[str, Any] = {}
    for table, values in data.items():
        if table not in SECTIONS:
            raise ConfigError(f"{source}: unknown table [{table}]; "
                              f"{_suggest(table, list(SECTIONS))}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: '{table}' must be a table ([{table}]), got {values!r}")
        cls = SECTIONS[table]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in values.items():
            if key not in fields:
                raise ConfigError(f"{source}: unknown key '{table}.{key}'; "
                                  f"{_suggest(key, list(fields))}")
            kwargs[key] = _coerce(source, f"{table}.{key}", value, fields[key])
        tables[table] = cls(**kwargs)
    cfg = RunConfig(**tables)
    if check:
        check_combinations(cfg, source)
    return cfg


def load_preset(path: str | Path, overrides: list[tuple[str, str, Any]] = (),
                check: bool = True) -> RunConfig:
    """Read a preset file and apply ``overrides`` (source, "table.key", value), CLI last."""
    from gputui import safeio

    path = Path(path)
    try:  # a regular file within a size bound: a fifo or /dev/zero is refused, never read
        text = safeio.read_text(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise ConfigError(f"{path}: is a link to {os.readlink(path)}, which does not "
                              f"exist; fix or remove the link") from None
        raise ConfigError(f"{path}: no such preset file; give a path or a name from "
                          f"`gputui presets`") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the preset ({safeio.reason(exc)})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: is not UTF-8 text, so not a TOML preset; give a .toml "
                          f"file") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax") from None
    cfg = anchor_code_paths(from_dict(data, source=str(path), check=False), path.parent)
    return apply_overrides(cfg, overrides, check=check, preset_source=str(path))


def anchor_code_paths(cfg: RunConfig, folder: Path) -> RunConfig:
    """A preset's relative factory file (or image folder) is found beside the preset: it is
    made absolute when it exists there, so the run (and its record, and a resume) finds it from
    any folder. Paths not found there stay relative to the folder gputui runs in."""
    from gputui.usercode import CODE_KEYS, parse

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
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as synthetic or cpu*2
    return key, value


def apply_overrides(cfg: RunConfig, overrides: list[tuple[str, str, Any]] = (),
                    check: bool = True, preset_source: str = "config") -> RunConfig:
    """Apply (source, "table.key", value) overrides in order, then run the combination checks."""
    data = cfg.to_dict()
    origins: dict[str, str] = {}
    for source, key, value in overrides:
        table, _, name = key.partition(".")
        from_dict({table: {name: value}}, source=source, check=False)  # one-line errors
        data[table][name] = value
        origins[key] = source
    cfg = from_dict(data, source=preset_source, check=False)
    if check:
        check_combinations(cfg, preset_source, origins)
    return cfg


def check_combinations(cfg: RunConfig, source: str,
                       origins: dict[str, str] | None = None) -> None:
    """Cross-field rules, all in one place; raises ConfigError on the first broken one.

    ``origins`` maps each overridden "table.key" to where its value came from ("--devices",
    "--set optim.lr=0.2"): a broken rule is blamed on the flags that set its keys, and on
    ``source`` (the preset) only when none of them was overridden."""
    from gputui.devices import DeviceSpecError, resolve_devices
    from gputui.training.strategies import registry
    from gputui.usercode import CODE_KEYS, find_problem

    def blame(*keys: str, text: str = "") -> str:
        """The flags that set the rule's ``keys`` or a key its message names."""
        named = [k for k in origins or {} if k in text]
        flags = list(dict.fromkeys(origins[k] for k in (*keys, *named) if k in (origins or {})))
        return ", ".join(flags) if flags else source

    # the [dist] table's own rules first: they hold whatever the strategy
    if cfg.dist.node_rank >= cfg.dist.nnodes:
        where = blame("dist.node_rank", "dist.nnodes")
        raise ConfigError(f"{where}: dist.node_rank ({cfg.dist.node_rank}) must be below "
                          f"dist.nnodes ({cfg.dist.nnodes})")
    if cfg.dist.nnodes > 1 and not cfg.dist.rdzv_endpoint:
        where = blame("dist.nnodes", "dist.rdzv_endpoint")
        raise ConfigError(f"{where}: dist.nnodes > 1 needs dist.rdzv_endpoint = 'HOST:PORT' "
                          f"(--rdzv-endpoint)")
    for key in CODE_KEYS:  # the factories' files and functions exist (read, never run)
        table, name = key.split(".")
        spec = getattr(getattr(cfg, table), name)
        problem = find_problem(spec, key) if spec else None
        if problem:
            raise ConfigError(f"{blame(key)}: {problem}")
    try:
        devices = resolve_devices(cfg.devices.spec, fallback=cfg.devices.fallback)
    except DeviceSpecError as exc:
        where = blame("devices.spec", "devices.fallback")
        # the message quotes the value; a preset file is named with the key that holds it
        raise ConfigError(f"{where}: {exc}" if where != source else
                          f"{source}: devices.spec: {exc}") from None
    info = registry.get(cfg.strategy.name)
    if info is None:
        names = ", ".join(registry.names())
        raise ConfigError(f"{blame('strategy.name')}: strategy.name must be one of {names}; "
                          f"got {cfg.strategy.name!r}")
    reason = info.why_not(cfg, devices)
    if reason:
        raise ConfigError(f"{blame('strategy.name', 'devices.spec', text=reason)}: {reason}")
    n = len(devices)
    batch = effective_batch_size(cfg, n)
    if batch < cfg.optim.micro_batches:
        where = blame("optim.batch_size", "optim.micro_batches", "optim.scale_with_devices")
        raise ConfigError(f"{where}: optim.batch_size ({batch}) is smaller than "
                          f"optim.micro_batches ({cfg.optim.micro_batches}); lower micro_batches")
    weights = cfg.strategy.split_weights
    if weights:
        if len(weights) != n:
            where = blame("strategy.split_weights", "devices.spec")
            raise ConfigError(f"{where}: strategy.split_weights has {len(weights)} entries for "
                              f"{n} devices; give one weight per device")
        if any(not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0 for w in weights):
            raise ConfigError(f"{blame('strategy.split_weights')}: strategy.split_weights must "
                              f"be positive numbers, got {weights!r}")
    if cfg.run.precision == "fp16" and all(d.kind == "cpu" for d in devices):
        raise ConfigError(f"{blame('run.precision', 'devices.spec')}: run.precision = 'fp16' "
                          f"needs CUDA devices; use 'bf16' on CPU")
    from gputui.training.runstore import CHECKPOINT_NAME

    resume = Path(cfg.run.resume_from) if cfg.run.resume_from else None
    if resume is not None and not (resume / CHECKPOINT_NAME if resume.is_dir()
                                   else resume).is_file():
        raise ConfigError(f"{blame('run.resume_from')}: run.resume_from: no checkpoint at "
                          f"{resume}; give a run folder holding {CHECKPOINT_NAME} (see `gputui "
                          f"resume`)")
    if _path_like(cfg.run.name):
        raise ConfigError(f"{blame('run.name')}: run.name {cfg.run.name!r} looks like a path; "
                          f"use a plain name of letters, digits, '-', '_' and '.' (e.g. "
                          f"'lenet-2dev')")


def _path_like(name: str) -> bool:
    """A run name that could point outside the runs folder or hide itself: separators, a
    leading dot or tilde, control characters."""
    return any(c in name for c in "/\\:") or name.startswith((".", "~")) or \
        any(ord(c) < 32 or ord(c) == 127 for c in name)


def field_help(table: str, key: str) -> str:
    """The documentation of one field (for help text and the TUI)."""
    for f in dataclasses.fields(SECTIONS[table]):
        if f.name == key:
            return f.metadata.get("help", "")
    raise KeyError(f"{table}.{key}")
