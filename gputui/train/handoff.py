"""What the parent (launcher) and the child processes (agent, ranks, warm worker) both know of
their hand-off: the :class:`LaunchSpec` a run starts from, the :class:`StopChannel` the parent
asks a stop through, the note a rank sends as it starts, and how a child leaves once its queue
is flushed. A leaf (torch-free, no parent or child module): neither side imports the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gputui.core.devices import Device

REASON_BYTES = 256  # the longest stop reason the parent passes down through shared memory


@dataclass(frozen=True)
class StopChannel:
    """The parent's stop request, shared with every process of the run: a spawn-context
    ``multiprocessing.Event`` and the reason in a shared byte buffer (``Array("c",
    REASON_BYTES)``). The first reason asked is kept. See ``gputui.train.stopping`` for
    the whole stop path."""

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
        """No stop asked (a warm worker's channel, before its next run)."""
        self.event.clear()
        self.reason_box.value = b""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a training process needs to run one run, as ``launcher.launch`` builds it.

    Picklable (it crosses ``spawn``, the elastic agent's fork server and a warm worker's job
    queue) and torch-free. The agent adds ``agent_pid`` and ``data_file`` for its ranks."""

    config: dict[str, Any]  # RunConfig.to_dict(): the run's configuration as the record keeps it
    devices: tuple[Device, ...]  # this node's devices, resolved once by the parent
    run_id: str  # the run folder's name
    run_dir: str  # the run folder (events.jsonl, summary.json, checkpoint)
    parent_pid: int  # the gputui process that launched the run (watched for its death)
    t_launch: float  # time.time() at the launch: init time is measured from here
    notes: tuple[str, ...] = ()  # the launcher's lines for the record (e.g. devices' fallback)
    queue: Any = None  # multiprocessing.Queue to the parent; None in a warm job (the worker's)
    stop: StopChannel | None = None  # the parent's stop request; None in a warm job
    agent_pid: int = 0  # ddp/fsdp: the gputui agent's pid (its SIGTERM is torch's teardown)
    data_file: str = ""  # ddp/fsdp: the node's shared copy of the dataset ("" = load it)


@dataclass(frozen=True)
class RankProcess:
    """Sent on the queue by each rank of a multi-process run as it starts: which process
    trains on which device (for the sampler's CPU % and RSS). Not an event, not recorded."""

    device: str
    pid: int
    rank: int


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
