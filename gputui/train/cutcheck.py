"""The check child's side: can model_parallel or pp cut the user's model? (imports torch).

``gputui.runs.model_check`` spawns :func:`check_main` before a run whose ``model.factory``
model is to be cut into stages: the user's code is imported and called here, in a short-lived
child, never in the parent. It builds the model as the run's strategy would (same data shape,
same seed) and cuts it with the strategies' own ``stage_blocks`` and ``cut_blocks``, so the
check and the run cannot disagree. Importing this module imports no torch (it is the spawn target).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from gputui.core.config import RunConfig
from gputui.core.errors import UserError, describe
from gputui.train import stopping
from gputui.core.devices import cpu_devices


def check_main(cfg: RunConfig, n: int, parent_pid: int, queue: Any) -> None:
    """Entry point of the check child: puts ("ok", None), ("cut", reason) when the model
    cannot be cut into ``n`` stages, or ("unknown", why) when the check itself could not tell
    (the model or its data did not build: the run reports that with its record). Ends when
    its parent does, whatever the user's code is doing."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        result = ("cut", cut_reason(cfg, n))
        if result[1] is None:
            result = ("ok", None)
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        result = ("unknown", describe(exc))
    queue.put(result)


def _watch_parent(pid: int) -> None:
    while not stopping.parent_gone(pid):
        time.sleep(stopping.PARENT_POLL_S)
    os._exit(0)


def cut_reason(cfg: RunConfig, n: int) -> str | None:
    """Why ``cfg.strategy.name`` cannot cut ``cfg``'s model into ``n`` stages, or None. A
    model or data that fails to build raises (the caller says it could not tell)."""
    import torch

    from gputui.train.data import load_from_config
    from gputui.train.strategies.base import Strategy
    from gputui.train.strategies.model_parallel import cut_blocks, stage_blocks

    torch.set_num_threads(1)  # a check, beside whatever else runs
    if not cfg.data.factory:  # the shape is all the build needs: a few examples, no download
        cfg = cfg.replace(data={"download": False, "train_size": min(64, cfg.data.train_size or 64),
                                "test_size": min(64, cfg.data.test_size or 64)})
    ds = load_from_config(cfg.data)
    builder = Strategy(cfg, cpu_devices(1), ds.in_channels, ds.image_size, ds.num_classes,
                       height=ds.height)
    model = builder.build_model()
    label = cfg.model.factory or cfg.model.name
    name = cfg.strategy.name
    try:
        cut_blocks(stage_blocks(model, label, name), n, list(cfg.strategy.split_points), label,
                   name, "devices" if name == "model_parallel" else "ranks")
    except UserError as exc:
        return str(exc)
    return None
