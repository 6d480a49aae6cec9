"""The prediction's kept measurements of this machine: the file that holds them
(``gputui.core.cachedir.KeptFigures``) and how a figure is keyed (what it depends on)."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from gputui.core.cachedir import KeptFigures, cache_dir
from gputui.core.config import RunConfig


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


class Cache(KeptFigures):
    """The prediction's figures of this machine (and bench-comm's peaks beside them)."""

    def __init__(self, path: Path | None = None):
        super().__init__(path=path or cache_dir() / f"predict-{machine_id()}.json")


@dataclass(frozen=True)
class ComputeKey:
    """What a compute figure depends on: model, data, precision, fast path, per-process batch
    (and its micro-batches), threads, the processes running at once, the device, and the
    strategy that trained it (``single``, or a multi-process one on a world of one rank).
    ``str()`` is its key in the cache file (the form kept files hold)."""

    model: str
    data: str
    precision: str
    compile: str
    channels_last: bool
    batch: int
    micro: int
    threads: int
    copies: int
    device: str
    strategy: str = "single"

    def __str__(self) -> str:
        parts = ["compute", self.model, self.data, self.precision, self.compile,
                 self.channels_last, f"b{self.batch}" + (f"/{self.micro}" if self.micro > 1
                                                         else ""),
                 f"t{self.threads}", f"x{self.copies}", self.device]
        if self.strategy != "single":
            parts.append(f"{self.strategy}@1")
        return "|".join(map(str, parts))

    def name(self) -> str:
        """The input as the user reads it: 'compute single, batch 64, 2 threads, 1 copy on
        cpu'."""
        batch = f"{self.batch}" + (f" in {self.micro} micro-batches" if self.micro > 1 else "")
        threads = f"{self.threads} thread{'' if self.threads == 1 else 's'}"
        return (f"compute {self.strategy}, batch {batch}, {threads}, "
                f"{self.copies} cop{'y' if self.copies == 1 else 'ies'} on {self.device}")


@dataclass(frozen=True)
class CommKey:
    """What a communication figure depends on: the device kind ("cpu", "gpu"), the devices,
    the bytes all-reduced (0: one step's fsdp collectives) and a tag (the GPU's name, the
    compute gap; an fsdp tag names the model, the data and the wrap). ``str()`` is its key
    in the cache file."""

    kind: str
    n: int
    size: int
    tag: str = ""

    def __str__(self) -> str:
        return f"comm|{self.kind}{':' + self.tag if self.tag else ''}|n{self.n}|{self.size}"

    def name(self) -> str:
        """'allreduce of 1.23 MiB over 2 devices' (scratch's: "scratch's allreduce of ...") or
        'fsdp collectives over 2 devices'."""
        what = ("fsdp collectives" if self.tag.startswith("fsdp")
                else ("scratch's " if self.tag.endswith("scratch") else "")
                + f"allreduce of {self.size / 2**20:.2f} MiB")
        return f"{what} over {self.n} devices"


def compute_key(cfg: RunConfig, batch: int, threads: int, copies: int, device: str,
                strategy: str = "single") -> ComputeKey:
    """The key of the compute figure of ``cfg`` at this batch, threads, copies and device."""
    return ComputeKey(cfg.model.label, cfg.data.label, cfg.run.precision, cfg.run.compile,
                      cfg.run.channels_last, batch, cfg.optim.micro_batches, threads, copies,
                      device, strategy)
