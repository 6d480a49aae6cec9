"""What the parent (launcher) and the child processes (agent, ranks, warm worker) both know of
their hand-off: the note a rank sends as it starts, the size of a failure reason, and how a
child leaves once its queue is flushed. A leaf: neither side imports the other for these.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

REASON_BYTES = 256  # the longest failure reason a child passes back through shared memory


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
