"""Where gputui keeps what it measured on this machine (the prediction's figures, the FLOP/s
peak, tune's and predict's measuring runs): one folder, one rule, for every writer.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE_DIR = "GPUTUI_CACHE_DIR"


def cache_dir() -> Path:
    """``$GPUTUI_CACHE_DIR``, else ``$XDG_CACHE_HOME/gputui``, else ``~/.cache/gputui``."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gputui"
