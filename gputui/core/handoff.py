"""What the parent (launcher) and the run host (``host.py``) both know of their hand-off: the
:class:`HostChannels` a host lives with, the :class:`LaunchSpec` a run starts from, the
:class:`StopChannel` that is the run's one stop flag, the notes that are not events (a rank's
pid, the record closed), and how a process leaves once its queue is flushed. A leaf
(torch-free, no parent or child module): neither side imports the other.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.core.config import RunConfig
from gputui.core.devices import Device

REASON_BYTES = 256  # the longest stop reason the parent passes down through shared memory


@dataclass(frozen=True)
class StopChannel:
    """The run's one stop flag, shared by the parent, the host and every rank: a spawn-context
    ``multiprocessing.Event`` and the reason in a shared byte buffer (``Array("c",
    REASON_BYTES)``). Any of them may ask (the parent's Stop, a signal, the parent's death);
    the first reason asked is kept. See ``gputui.train.stopping`` for the whole stop path."""

    event: Any  # multiprocessing.Event: set once a stop is asked
    reason_box: Any  # multiprocessing.Array("c", REASON_BYTES): the reason, UTF-8

    @classmethod
    def create(cls, ctx) -> "StopChannel":
        """A fresh channel from the multiprocessing context ``ctx`` (spawn)."""
        return cls(ctx.Event(), ctx.Array("c", REASON_BYTES))

    def ask(self, reason: str) -> None:
        """Ask the run to stop; ``reason`` is recorded unless a stop was asked already."""
        if not self.event.is_set():
            self.reason_box.value = reason.encode("utf-8")[:REASON_BYTES - 1]
        self.event.set()

    def asked(self) -> bool:
        """A stop has been asked."""
        return self.event.is_set()

    def reason(self) -> str:
        """The reason asked ("" when none, or when the buffer cannot be read)."""
        try:
            return self.reason_box.value.decode("utf-8", "replace")
        except (OSError, ValueError, AttributeError):
            return ""

    def clear(self) -> None:
        """No stop asked (a warm host's channel, before its next run)."""
        self.event.clear()
        self.reason_box.value = b""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a run needs, as ``launcher.launch`` builds it and the host receives it.

    Picklable (it crosses ``spawn``, a host's job queue and the fork server of the ranks) and
    torch-free. The host fills the last four fields for its ranks."""

    config: RunConfig  # the run's configuration, validated once by the parent
    devices: tuple[Device, ...]  # this node's devices, resolved once by the parent
    run_id: str  # the run folder's name
    run_dir: str  # the run folder (events.jsonl, summary.json, checkpoint)
    parent_pid: int  # the gputui process that launched the run (watched for its death)
    t_launch: float  # time.time() at the launch: init time is measured from here
    notes: tuple[str, ...] = ()  # the launcher's lines for the record (e.g. devices' fallback)
    multiprocess: bool = False  # ddp/fsdp: the host starts one rank per device
    queue: Any = None  # ranks: multiprocessing.Queue to the host (their events)
    stop: StopChannel | None = None  # ranks: the run's stop flag (the host's)
    host_pid: int = 0  # ranks: the host's pid (its SIGTERM is torch's teardown)
    data_file: str = ""  # ranks: the node's shared copy of the dataset ("" = load it)
    ledger: Any = None  # ranks: the node's collective counts (RawArray, gputui.core.hang)


@dataclass(frozen=True)
class HostChannels:
    """What a run host shares with the parent for its life (spawn-context objects)."""

    queue: Any  # multiprocessing.Queue: events and notes to the parent (the handle polls it)
    stop: StopChannel  # the stop flag of the run in flight (cleared before each run)
    jobs: Any  # multiprocessing.Queue: LaunchSpecs to run; None asks the host to exit
    ready: Any  # multiprocessing.Event: set once the host has loaded what it preloads
    parent_pid: int  # the gputui process (the host ends when it is gone)
    warm: bool = False  # preload torch and stay for more runs (a host started early)
    cuda: tuple[int, ...] = ()  # warm: the GPUs whose CUDA context the host creates


@dataclass(frozen=True)
class RankProcess:
    """Sent by each rank of a multi-process run as it starts (forwarded by the host): which
    process trains on which device (for the sampler's CPU % and RSS). Not an event."""

    device: str
    pid: int
    rank: int


@dataclass(frozen=True)
class RecordClosed:
    """The host's last word on a run, after its record is closed: ``ended`` is False when even
    the space set aside could not take the terminal event (the parent then appends it)."""

    ended: bool


def quick_exit(queue, code: int) -> None:
    """Flush the queue to the parent and leave without tearing torch's modules down one by
    one: the interpreter's finalisation with torch loaded takes seconds on a busy machine,
    and the parent waits for this process before it reports the run's end."""
    import sys

    try:
        queue.close()
        queue.join_thread()  # every event put so far is in the pipe
    except (OSError, ValueError, AssertionError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# The node's copy of a multi-process run's dataset (``gputui.train.shared_data``): the host
# writes it, its ranks map it, and the parent removes it when it had to kill the host.

def data_file(run_id: str) -> Path:
    """Where the node's copy of the dataset goes (RAM-backed when possible)."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"gputui-{run_id}-data.pt"  # run ids are unique; the launcher cleans up


def data_file_failed(path: Path) -> Path:
    """The marker the host leaves beside the copy when it could not write it."""
    return path.with_suffix(".failed")


def remove_data_file(path: Path) -> None:
    """Delete the node's copy (ranks that mapped it keep their mapping)."""
    for p in (path, path.with_suffix(".tmp"), data_file_failed(path)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
