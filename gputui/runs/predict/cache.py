"""The prediction's kept measurements of this machine: where they live, how a figure is
keyed (what it depends on), and the JSON file that holds them, written atomically."""

from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

from gputui.core.cachedir import cache_dir
from gputui.core.config import RunConfig
from gputui.core.filewrite import make_folder, write_atomic
from gputui.core.usercode import data_label, model_label


def machine_id() -> str:
    """This machine, as the cache names it: host name and core count (GPU names are part of
    each GPU figure's key)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", platform.node() or "host")
    return f"{host}-{cores or 1}cores"


def cores() -> int:
    """The cores this process may run on."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return n or 1


class Cache:
    """The measurements of this machine: a JSON dict of key -> figures, written atomically."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_dir() / f"predict-{machine_id()}.json"
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.data = {}

    def get(self, key: str) -> dict | None:
        return self.data.get(key)

    def put(self, key: str, value: dict) -> None:
        self.data[key] = dict(value, measured=time.strftime("%Y-%m-%d %H:%M:%S"),
                              measured_t=time.time())
        # through filewrite: a cache folder that is a file is one line (WriteFailed), not a
        # NotADirectoryError traceback
        make_folder(self.path.parent,
                    "set GPUTUI_CACHE_DIR or XDG_CACHE_HOME to a folder you can write to")
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")


def compute_key(cfg: RunConfig, batch: int, threads: int, copies: int, device: str,
                strategy: str = "single") -> str:
    """What a compute figure depends on: model, data, precision, fast path, per-process batch
    (and its micro-batches), threads, the processes running at once, the device, and the
    strategy that trained it (``single``, or a multi-process one on a world of one rank)."""
    d = cfg.to_dict()
    micro = cfg.optim.micro_batches  # a step of several micro-batches is another figure
    parts = ["compute", model_label(d), data_label(d), cfg.run.precision, cfg.run.compile,
             cfg.run.channels_last, f"b{batch}" + (f"/{micro}" if micro > 1 else ""),
             f"t{threads}", f"x{copies}", device]
    if strategy != "single":
        parts.append(f"{strategy}@1")
    return "|".join(map(str, parts))


def comm_key(kind: str, n: int, size: int, label: str = "") -> str:
    return f"comm|{kind}{':' + label if label else ''}|n{n}|{size}"
