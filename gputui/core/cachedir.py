"""Where gputui keeps what it measured on this machine, and how: one folder, one rule, one file
kind for every kept figure (the prediction's figures and bench-comm's peaks, the FLOP/s peak,
the planner's traces, tune's and predict's measuring runs).

Every figure file is a JSON dict of key -> figures (:class:`KeptFigures`), stamped with when
it was measured and written atomically through ``gputui.core.filewrite``: a writer that dies
leaves the old file whole, and what another process kept since this one read the file stays
kept.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gputui.core.filewrite import make_folder, write_atomic

ENV_CACHE_DIR = "GPUTUI_CACHE_DIR"
HINT = "set GPUTUI_CACHE_DIR or XDG_CACHE_HOME to a folder you can write to"


def cache_dir() -> Path:
    """``$GPUTUI_CACHE_DIR``, else ``$XDG_CACHE_HOME/gputui``, else ``~/.cache/gputui``."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gputui"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class KeptFigures:
    """One file of kept figures: ``name`` in :func:`cache_dir` (read when the object is made:
    the folder may be moved by the environment until then), or ``path`` itself."""

    def __init__(self, name: str = "", path: Path | None = None):
        self.path = path if path is not None else cache_dir() / name
        self.data: dict[str, Any] = _read(self.path)
        self._dropped: set[str] = set()

    def get(self, key: object) -> Any:
        """What is kept under ``key`` (a string, or a key object whose ``str()`` is one)."""
        return self.data.get(str(key))

    def drop(self, key: str) -> None:
        """Forget ``key`` (on disk at the next :meth:`put`)."""
        self.data.pop(key, None)
        self._dropped.add(key)

    def put(self, key: object, value: dict) -> None:
        """Keep ``value`` under ``key`` with when it was measured, merged into what the file
        holds now. WriteFailed (one line, the fix named) when the folder cannot be written."""
        self.data[str(key)] = dict(value, measured=time.strftime("%Y-%m-%d %H:%M:%S"),
                              measured_t=time.time())
        merged = {k: v for k, v in _read(self.path).items() if k not in self._dropped}
        merged.update(self.data)
        self.data = merged
        make_folder(self.path.parent, HINT)
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")
