"""The cross-field rules of a run's config, in one place.

:func:`validate` checks a config against devices already resolved (once per run by
``gputui.hw.discovery``, or from the app's last discovery): pure, it asks neither the hardware
nor the disk, so the app runs it on every keystroke. :func:`check_files` checks what the config
names on disk (the factories' files, the checkpoint to resume from): once, when a run or a
sweep starts. Both raise :class:`ConfigError` with one line on the first broken rule.

``origins`` maps each overridden "table.key" to where its value came from ("--devices",
"--set optim.lr=0.2", see ``config.override_origins``): a broken rule is blamed on the flags
that set its keys, and on ``source`` (the preset) only when none of them was overridden.
"""

from __future__ import annotations

from pathlib import Path

from gputui.core import registry
from gputui.core.config import ConfigError, RunConfig
from gputui.core.config_schema import TEXT_DATASETS, effective_batch_size
from gputui.core.devices import Device, DeviceSpecError


def validate(cfg: RunConfig, devices: list[Device], source: str,
             origins: dict[str, str] | None = None) -> None:
    """Every rule that joins several keys, or a key and the ``devices`` the config resolved
    to; raises ConfigError on the first broken one."""
    def blame(*keys: str, text: str = "") -> str:
        return _blame(source, origins, *keys, text=text)

    # the [dist] table's own rules first: they hold whatever the strategy
    if cfg.dist.node_rank >= cfg.dist.nnodes:
        where = blame("dist.node_rank", "dist.nnodes")
        raise ConfigError(f"{where}: dist.node_rank ({cfg.dist.node_rank}) must be below "
                          f"dist.nnodes ({cfg.dist.nnodes})")
    if cfg.dist.nnodes > 1 and not cfg.dist.rdzv_endpoint:
        where = blame("dist.nnodes", "dist.rdzv_endpoint")
        raise ConfigError(f"{where}: dist.nnodes > 1 needs dist.rdzv_endpoint = 'HOST:PORT' "
                          f"(--rdzv-endpoint)")
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
    task_problem = _task_rule(cfg)
    if task_problem:
        keys, text = task_problem
        raise ConfigError(f"{blame(*keys)}: {text}")
    if path_like(cfg.run.name):
        raise ConfigError(f"{blame('run.name')}: run.name {cfg.run.name!r} looks like a path; "
                          f"use a plain name of letters, digits, '-', '_' and '.' (e.g. "
                          f"'lenet-2dev')")


def _task_rule(cfg: RunConfig) -> tuple[tuple[str, ...], str] | None:
    """The model and the data agree on the task: gpt reads text, the image models images;
    gpt's heads divide its width; the text dataset has its path. (keys, message) or None."""
    m, d = cfg.model, cfg.data
    text = d.name in TEXT_DATASETS and not d.factory
    if not m.factory and m.name == "gpt" and not text and not d.factory:
        return (("model.name", "data.name"), f"model.name = 'gpt' reads text; set data.name "
                                             f"to pystdlib or text (got {d.name!r})")
    if text and not m.factory and m.name != "gpt":
        return (("model.name", "data.name"), f"data.name = {d.name!r} is text (byte tokens); "
                                             f"use model.name = 'gpt' or a model.factory that "
                                             f"reads tokens (got model.name = {m.name!r})")
    if not m.factory and m.name == "gpt" and m.n_embd % m.n_head:
        return (("model.n_embd", "model.n_head"), f"model.n_head ({m.n_head}) must divide "
                                                  f"model.n_embd ({m.n_embd})")
    if text and d.name == "text" and not d.path:
        return (("data.name", "data.path"), "data.name = 'text' needs data.path: a text file "
                                            "or a folder of them")
    return None


def device_error(exc: DeviceSpecError, source: str,
                 origins: dict[str, str] | None = None) -> ConfigError:
    """A devices.spec that discovery could not meet, as the one line blaming its flag (or the
    preset, naming the key)."""
    where = _blame(source, origins, "devices.spec", "devices.fallback")
    # the message quotes the value; a preset file is named with the key that holds it
    return ConfigError(f"{where}: {exc}" if where != source else f"{source}: devices.spec: {exc}")


def check_files(cfg: RunConfig, source: str, origins: dict[str, str] | None = None) -> None:
    """The files the config names exist: each factory's file and function (read and parsed,
    never run) and the checkpoint ``run.resume_from`` resumes. Reads the disk: run it once
    when a run or sweep starts, not on every keystroke."""
    from gputui.core.runstore import CHECKPOINT_NAME
    from gputui.core.usercode import CODE_KEYS, find_problem

    for key in CODE_KEYS:
        table, name = key.split(".")
        spec = getattr(getattr(cfg, table), name)
        problem = find_problem(spec, key) if spec else None
        if problem:
            raise ConfigError(f"{_blame(source, origins, key)}: {problem}")
    if cfg.data.name == "text" and cfg.data.path and not cfg.data.factory \
            and not Path(cfg.data.path).expanduser().exists():
        raise ConfigError(f"{_blame(source, origins, 'data.path')}: data.path: no file or "
                          f"folder at {cfg.data.path}")
    resume = Path(cfg.run.resume_from) if cfg.run.resume_from else None
    if resume is not None and not (resume / CHECKPOINT_NAME if resume.is_dir()
                                   else resume).is_file():
        raise ConfigError(f"{_blame(source, origins, 'run.resume_from')}: run.resume_from: no "
                          f"checkpoint at {resume}; give a run folder holding {CHECKPOINT_NAME} "
                          f"(see `gputui resume`)")


def path_like(name: str) -> bool:
    """A run name that could point outside the runs folder or hide itself: separators, a
    leading dot or tilde, control characters."""
    return any(c in name for c in "/\\:") or name.startswith((".", "~")) or \
        any(ord(c) < 32 or ord(c) == 127 for c in name)


def _blame(source: str, origins: dict[str, str] | None, *keys: str, text: str = "") -> str:
    """The flags that set the rule's ``keys`` or a key its message ``text`` names, else
    ``source``."""
    origins = origins or {}
    named = [k for k in origins if k in text]
    flags = list(dict.fromkeys(origins[k] for k in (*keys, *named) if k in origins))
    return ", ".join(flags) if flags else source
