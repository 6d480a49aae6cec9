"""One dataset load per node for a multi-process run, off the start-up's critical path.

Without this, every rank generates (or reads and standardises) the same dataset after its own
torch import, one after another with everything else it does before the first step. Here the
host loads it in a thread while the ranks are being spawned, writes it once to a file in
shared memory (/dev/shm when there is one), and each rank maps that file (``mmap``: one copy
in memory for all ranks). If the host cannot load it, the ranks load it themselves, so a bad
dataset fails with the usual message.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from gputui.core.handoff import data_file_failed

WAIT_S = 600.0  # a rank waits at most this long for the host's file, then loads itself


def start_prefetch(section: Any, path: Path) -> threading.Thread:
    """Load the dataset of the ``[data]`` section (``RunConfig.data``) in a thread and
    publish it at ``path``."""
    from gputui.train.data import load_from_config  # imported here, not in the thread

    def work() -> None:
        try:
            publish(load_from_config(section), path)
        except BaseException as exc:  # noqa: BLE001 - the ranks then load it themselves
            data_file_failed(path).write_text(f"{type(exc).__name__}: {exc}", encoding="utf-8")

    thread = threading.Thread(target=work, name="gputui-data", daemon=True)
    thread.start()
    return thread


def publish(ds: Any, path: Path) -> None:
    """Write a tensor dataset for the ranks to map; a lazy one (a user's torch Dataset) cannot
    be shared this way, so the ranks are told to load it themselves."""
    import torch

    from gputui.train.data import Dataset

    if not isinstance(ds, Dataset):
        data_file_failed(path).write_text("a lazy dataset: each rank reads it", encoding="utf-8")
        return
    tmp = path.with_suffix(".tmp")
    torch.save({"name": ds.name, "train_x": ds.train_x, "train_y": ds.train_y,
                "test_x": ds.test_x, "test_y": ds.test_y, "num_classes": ds.num_classes,
                "task": ds.task, "baseline": ds.baseline, "source": ds.source}, tmp)
    os.replace(tmp, path)  # a rank never sees half a file


def loader(path: Path):
    """A function with ``load_from_config``'s signature that maps the host's file instead."""
    def load(section):
        import torch

        from gputui.train.data import Dataset, load_from_config

        deadline = time.monotonic() + WAIT_S
        failed = data_file_failed(path)
        while not path.exists() and not failed.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not path.exists():
            return load_from_config(section)
        d = torch.load(path, mmap=True, weights_only=True)
        return Dataset(d["name"], d["train_x"], d["train_y"], d["test_x"], d["test_y"],
                       d["num_classes"], d["task"], d["baseline"], d["source"])
    return load
