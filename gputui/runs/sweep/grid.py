"""A sweep's grid as typed: device counts, fast-path axes, what the counts are (GPUs or CPU
virtual devices) and each point's devices.spec. Each is checked where the flag gives it
(ConfigError, one line). Torch-free; ``gputui.runs.sweep.runner`` builds its points from these.
"""

from __future__ import annotations

from typing import Any

from gputui.core.config import ConfigError
from gputui.core.config_schema import COMPILE_MODES, PRECISIONS
from gputui.core.devices import MAX_DEVICES, wants_gpus


def parse_devices(text: str) -> list[str]:
    """"1,2" or "cpu,cpu*2": device counts (or CPU specs) to sweep over, each 1 to
    MAX_DEVICES."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    for item in items:
        count = item[4:] if item.startswith("cpu*") else "1" if item == "cpu" else item
        ok = count.isdecimal() and count.isascii() and len(count) <= 3 \
            and 0 < int(count) <= MAX_DEVICES
        if not ok:
            raise ConfigError(f"--devices {text[:80]}: '{item[:20]}' is not a device count; "
                              f"give counts from 1 to {MAX_DEVICES} like 1,2 (or cpu,cpu*2)")
    if not items:
        raise ConfigError("--devices: give at least one device count, e.g. --devices 1,2")
    return list(dict.fromkeys(items))


def axis_grid(axes: dict) -> list[list[tuple[str, Any]]]:
    """Every combination of the fast-path axes' values, as (key, value) lists ([[]]: none)."""
    grid: list[list[tuple[str, Any]]] = [[]]
    for key, values in axes.items():
        grid = [[*combo, (key, v)] for combo in grid for v in values]
    return grid


def parse_axis(option: str, key: str, text: str) -> list:
    """The values of one fast-path axis as typed (``--compile off,default``), checked against
    the config field's choices; ConfigError (one line) otherwise."""
    items = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if key == "data.context":  # token counts: the context-length sweep (single against cp)
        bad = [t for t in items if not (t.isdecimal() and t.isascii() and 0 < int(t) <= 2**20)]
        choices = "token counts from 1 to 1048576"
        if bad or not items:
            raise ConfigError(f"{option} {text}: {', '.join(map(repr, bad)) or 'nothing'} is "
                              f"not a context length; give {choices}, e.g. {option} 256,512")
        return list(dict.fromkeys(int(t) for t in items))
    if key == "run.channels_last":
        words = {"off": False, "false": False, "no": False, "on": True, "true": True, "yes": True}
        bad = [t for t in items if t.lower() not in words]
        choices = "off, on"
        values: list[Any] = [words.get(t.lower()) for t in items]
    else:
        allowed = PRECISIONS if key == "run.precision" else COMPILE_MODES
        bad = [t for t in items if t not in allowed]
        choices, values = ", ".join(allowed), items
    if bad or not items:
        raise ConfigError(f"{option} {text}: {', '.join(map(repr, bad)) or 'nothing'} is not "
                          f"one of {choices}; give a comma list, e.g. {option} "
                          f"{choices.replace(' ', '')}")
    return list(dict.fromkeys(values))


KINDS = ("auto", "gpu", "cpu")
KIND_WORDS = {"gpu": "GPUs", "cpu": "CPU virtual devices"}


def resolve_kind(kind: str, preset_spec: str, gpus: list | None = None,
                 no_gpu_reason: str = "") -> tuple[str, str]:
    """What a sweep's device counts mean, "gpu" or "cpu", and a line for the user.

    "auto" is GPUs when the preset names GPUs and this machine has some, else CPU virtual
    devices; the line then says how to scale over the GPUs that are there. "gpu" on a machine
    without one is refused (ConfigError, one line)."""
    from gputui.hw.discovery import discover_gpus

    if kind not in KINDS:
        raise ConfigError(f"--kind {kind}: must be one of {', '.join(KINDS)}")
    if gpus is None:
        gpus, no_gpu_reason = discover_gpus()
    have = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
    if kind == "gpu":
        if not gpus:
            raise ConfigError(f"--kind gpu: no GPU is available "
                              f"({no_gpu_reason or 'no NVIDIA GPU was found'}); use --kind cpu")
        return "gpu", f"scaling over GPUs (this machine has {have})"
    if kind == "cpu" or not gpus:
        return "cpu", "scaling over CPU virtual devices" + (
            f"; this machine has {have}: --kind gpu scales over them" if gpus else "")
    if wants_gpus(preset_spec):
        return "gpu", f"scaling over GPUs, as the preset names GPUs (this machine has {have})"
    return "cpu", (f"scaling over CPU virtual devices, as the preset names CPU devices; this "
                   f"machine has {have}: --kind gpu scales over them")


def spec_for(item: str, kind: str) -> str:
    """The devices.spec of a grid point: a count of GPUs or of CPU virtual devices."""
    if not item.isdigit():
        return item
    if kind == "cpu":
        return "cpu" if item == "1" else f"cpu*{item}"
    return item  # the first N GPUs
