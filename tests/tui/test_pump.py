"""The pump on its own: coalescing, bounds, back-pressure, the end of a run, a broken handle."""

from __future__ import annotations

import threading

from scripted import T0, FakeHandle, run_events

from gputui.core.events import DeviceSample, LogLine, RunFinished, StepMetrics
from gputui.tui.messages import DeviceSamples, PumpFailed, RunEventBatch
from gputui.tui.pump import EventPump


def step(i: int) -> StepMetrics:
    return StepMetrics(epoch=1, step=i, global_step=i, steps_per_epoch=10**6, loss=1.0 / i,
                       samples_per_s=float(i), step_time_s=0.01, lr=0.1, t=T0 + i)


class Sink:
    """Collects posted messages; acknowledges batches only when told to."""

    def __init__(self, auto_ack: bool = True) -> None:
        self.messages: list = []
        self.auto_ack = auto_ack

    def __call__(self, message) -> bool:
        self.messages.append(message)
        if self.auto_ack and hasattr(message, "ack"):
            message.ack()
        return True

    def of(self, cls):
        return [m for m in self.messages if isinstance(m, cls)]


def test_samples_coalesce_latest_wins_per_device():
    sink = Sink()
    pump = EventPump(FakeHandle([]), sink)
    pump.add_samples([DeviceSample(device=f"cpu:{i % 2}", util=float(i), t=T0 + i)
                      for i in range(1000)])
    pump.flush()
    [msg] = sink.of(DeviceSamples)
    assert {s.device: s.util for s in msg.samples} == {"cpu:0": 998.0, "cpu:1": 999.0}
    assert not sink.of(RunEventBatch)


def test_only_one_batch_in_flight_until_acknowledged():
    sink = Sink(auto_ack=False)
    pump = EventPump(FakeHandle([]), sink)
    pump.add([step(1)])
    pump.flush()
    pump.add([step(2), step(3)])
    pump.flush()
    pump.flush()
    assert len(sink.of(RunEventBatch)) == 1  # the second waits for the ack
    sink.of(RunEventBatch)[0].ack()
    pump.flush()
    batches = sink.of(RunEventBatch)
    assert [len(b.events) for b in batches] == [1, 2]


def test_steps_are_thinned_but_the_latest_kept_and_logs_capped():
    sink = Sink(auto_ack=False)
    pump = EventPump(FakeHandle([]), sink, max_steps=100, max_logs=10)
    pump.add([step(1)])
    pump.flush()  # in flight, not acknowledged: the rest piles up in pending
    pump.add([step(i) for i in range(2, 20_002)])
    pump.add([step(20_002)])  # the latest survives whatever the parity of the count
    pump.add([LogLine(level="info", message=str(i)) for i in range(50)])
    steps = [e for e in pump.pending if isinstance(e, StepMetrics)]
    assert len(steps) <= 100
    assert steps[-1].global_step == 20_002
    logs = [e for e in pump.pending if isinstance(e, LogLine)]
    assert [e.message for e in logs] == [str(i) for i in range(10)]
    sink.of(RunEventBatch)[0].ack()
    pump.flush()
    assert sink.of(RunEventBatch)[-1].dropped_logs == 40


def test_run_ends_after_the_terminal_event_is_handed_over():
    events = run_events(epochs=2)
    handle = FakeHandle(events, chunk=7)
    sink = Sink()
    pump = EventPump(handle, sink, poll_timeout=0.01)
    pump.run()
    got = [e for b in sink.of(RunEventBatch) for e in b.events]
    assert got == [e for e in events if not isinstance(e, DeviceSample)]
    assert isinstance(got[-1], RunFinished)
    assert pump.drained


def test_cancel_stops_the_loop():
    handle = FakeHandle(run_events(), hold_terminal=True)
    sink = Sink()
    stop = threading.Event()
    pump = EventPump(handle, sink, poll_timeout=0.01)
    t = threading.Thread(target=pump.run, args=(stop.is_set,))
    t.start()
    stop.set()
    t.join(timeout=5)
    assert not t.is_alive()


def test_a_broken_handle_is_reported_not_raised():
    class Broken(FakeHandle):
        def poll(self, timeout=0.0, max_events=10_000):
            raise OSError("queue closed")

    sink = Sink()
    EventPump(Broken([]), sink).run()
    [msg] = sink.of(PumpFailed)
    assert "queue closed" in msg.error


def test_samples_message_can_replace_only_same_run():
    a = DeviceSamples("r1", ())
    assert a.can_replace(DeviceSamples("r1", ()))
    assert not a.can_replace(DeviceSamples("r2", ()))
    assert not a.can_replace(RunEventBatch("r1", ()))


def test_a_batch_left_unread_by_a_screen_that_went_away_does_not_stall_the_run():
    # The screen closes with the first batch (and samples) queued, never acknowledged; what
    # comes after is acknowledged at once (RunController.deliver, with no screen). The pump
    # goes on and hands over the rest, terminal included.
    events = run_events(epochs=2)
    gone = threading.Event()

    class Dropper(Sink):
        def __call__(self, message) -> bool:
            self.messages.append(message)
            if gone.is_set() and hasattr(message, "ack"):
                message.ack()
            elif isinstance(message, RunEventBatch):
                gone.set()  # the first batch is lost with its screen
            return True

    sink = Dropper()
    pump = EventPump(FakeHandle(events, chunk=7), sink, poll_timeout=0.01,
                     target_gone=gone.is_set)
    t = threading.Thread(target=pump.run)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and pump.drained
    got = [e for b in sink.of(RunEventBatch) for e in b.events]
    assert got == [e for e in events if not isinstance(e, DeviceSample)]


def test_while_the_target_is_there_an_unacknowledged_batch_holds_the_next():
    sink = Sink(auto_ack=False)
    pump = EventPump(FakeHandle([step(i) for i in range(1, 50)], chunk=5), sink,
                     poll_timeout=0.01, target_gone=lambda: False)
    stop = threading.Event()
    t = threading.Thread(target=pump.run, args=(stop.is_set,))
    t.start()
    t.join(timeout=0.5)
    stop.set()
    t.join(timeout=5)
    assert len(sink.of(RunEventBatch)) == 1
