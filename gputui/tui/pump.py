"""The pump: moves a run's events from its handle to the UI thread without flooding it.

It runs inside a thread worker, the handle's owner. Each loop polls the handle's two
streams, its events (never longer than ``poll_timeout``) and its devices' samples, and posts
at most two messages:

* :class:`RunEventBatch` with every event but the device samples, in order. Only one batch
  is in flight at a time: while the UI has not acknowledged the previous one, new events wait
  in ``pending``, where step metrics are thinned (every other one dropped) past ``max_steps``
  and log lines past ``max_logs`` are counted instead of kept. A burst of any size thus costs
  the UI a bounded number of messages and a bounded amount of work per message.
* :class:`DeviceSamples` with the latest sample of every device (latest wins), posted only
  when the previous one was shown (or was lost for ``samples_grace_s``). The batch that ends
  the run waits until the last samples are shown.

A batch whose target went away unread (``target_gone``: the run screen was closed) is given
up, so a run is pumped to its end whether or not anything shows it.

The class imports nothing from Textual but the message types, and is tested without an app.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from gputui.core.events import DeviceSample, Event, LogLine, StepMetrics, is_terminal
from gputui.tui.messages import DeviceSamples, PumpFailed, RunEventBatch

Post = Callable[[Any], bool]


class EventPump:
    """Polls one run handle and posts coalesced, bounded messages through ``post``."""

    def __init__(self, handle: Any, post: Post, *, poll_timeout: float = 0.1,
                 max_steps: int = 4000, max_logs: int = 1000,
                 samples_grace_s: float = 2.0,
                 target_gone: Callable[[], bool] = lambda: False) -> None:
        self.handle = handle
        self.run_id = str(getattr(handle, "run_id", ""))
        self.post = post
        # true once whoever takes the messages went away, unacknowledged batch and all
        self.target_gone = target_gone
        self.poll_timeout = poll_timeout
        self.max_steps = max_steps
        self.max_logs = max_logs
        self.samples_grace_s = samples_grace_s
        self.pending: list[Event] = []
        self._steps = 0
        self._logs = 0
        self._dropped_logs = 0
        self._batch_free = threading.Event()
        self._batch_free.set()
        self._latest: dict[str, DeviceSample] = {}
        self._samples_dirty = False
        self._samples_posted = 0
        self._samples_shown = 0
        self._samples_posted_at = 0.0
        self.terminal_seen = False
        self.failed = False  # polling raised: the run can no longer be watched
        self.polled = 0  # events taken from the handle, for tests and the status line

    # ------------------------------------------------------------------ sorting
    def add_samples(self, samples: list[DeviceSample]) -> None:
        """Take the handle's new samples into the latest-sample table (latest wins)."""
        for s in samples:
            self._latest[s.device] = s
            self._samples_dirty = True

    def add(self, events: list[Event]) -> None:
        """Take a poll's events into the pending batch."""
        self.polled += len(events)
        for ev in events:
            if isinstance(ev, LogLine):
                if self._logs >= self.max_logs:
                    self._dropped_logs += 1
                    continue
                self._logs += 1
            if is_terminal(ev):
                self.terminal_seen = True
            self.pending.append(ev)
            if isinstance(ev, StepMetrics):
                self._steps += 1
                if self._steps > self.max_steps:
                    self._thin_steps()

    def _thin_steps(self) -> None:
        # Drop every other step metric counting back from the latest, which always stays: the
        # loss curve keeps its shape at half the resolution, and the latest values are exact.
        steps = [i for i, ev in enumerate(self.pending) if isinstance(ev, StepMetrics)]
        drop = set(steps[-2::-2])
        self.pending = [ev for i, ev in enumerate(self.pending) if i not in drop]
        self._steps = len(steps) - len(drop)

    # ------------------------------------------------------------------ posting
    def flush(self) -> bool:
        """Post what may be posted now; False when the target no longer takes messages."""
        if not self._flush_samples():
            return False
        # The batch that ends the run waits until the run's last readings are shown, so the
        # screen shows them before the end.
        last_readings = (self.terminal_seen and (self._samples_dirty or self._samples_unshown)
                         and not self.target_gone())
        if self.pending and self._batch_free.is_set() and not last_readings:
            self._batch_free.clear()
            batch = RunEventBatch(self.run_id, tuple(self.pending), self._dropped_logs,
                                  ack=self._batch_free.set)
            self.pending, self._steps, self._logs, self._dropped_logs = [], 0, 0, 0
            if not self.post(batch):
                self._batch_free.set()
                return False
        return True

    @property
    def _samples_unshown(self) -> bool:
        return self._samples_shown < self._samples_posted

    def _flush_samples(self) -> bool:
        now = time.monotonic()
        if self._samples_dirty and (not self._samples_unshown
                                    or now - self._samples_posted_at > self.samples_grace_s):
            self._samples_posted += 1
            seq = self._samples_posted
            msg = DeviceSamples(self.run_id, tuple(self._latest.values()),
                                ack=lambda: self._mark_shown(seq))
            self._samples_dirty = False
            self._samples_posted_at = now
            if not self.post(msg):
                return False
        return True

    def _mark_shown(self, seq: int) -> None:
        self._samples_shown = max(self._samples_shown, seq)

    @property
    def drained(self) -> bool:
        """The run ended and every event was handed over."""
        return self.terminal_seen and not self.pending

    # ------------------------------------------------------------------ the loop
    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Poll until the run's terminal event is handed over and acknowledged (or its
        target went away), or ``cancelled()`` is true."""
        while not cancelled():
            try:
                events = self.handle.poll(timeout=self.poll_timeout)
                samples = self.handle.samples()
            except Exception as exc:  # the handle broke: tell the user, stop watching
                self.failed = True
                self.post(PumpFailed(self.run_id, f"{type(exc).__name__}: {exc}"))
                return
            self.add(events)
            self.add_samples(samples)
            if not self.flush():
                return
            if self.drained:
                # returning means "the end is shown": wait for the last batch's ack
                while not self._batch_free.wait(self.poll_timeout):
                    if cancelled() or self.target_gone():
                        break
                return
            if not events and self.pending:
                # The UI still holds the previous batch: wait for it, not for the handle.
                if not self._batch_free.wait(self.poll_timeout) and self.target_gone():
                    self._batch_free.set()  # it went away unread: the record has it all
