"""The run record's append (``runstore.EventLog``: one whole line per ``os.write``, cut back on
a failed write) against the writer it replaced (a buffered text file, ``write`` + ``flush``
per event), on the same events in the same folder.

    .venv/bin/python benchmarks/bench_event_log.py [--events 20000] [--rounds 5] [--dir DIR]

Each round serialises and writes ``--events`` step events with each writer (the order swapped
every round) to a fresh file; medians of events/s and the ratio new / old are printed. Both
do one write system call per event; the new one adds an fstat (the offset to cut back to).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gputui.core.events import StepMetrics
from gputui.core.runstore import EventLog


def _old(path: Path, events: list[StepMetrics]) -> float:
    t0 = time.perf_counter()
    with open(path, "a", encoding="utf-8") as fh:
        for ev in events:
            fh.write(ev.to_json() + "\n")
            fh.flush()
    return time.perf_counter() - t0


def _new(path: Path, events: list[StepMetrics]) -> float:
    t0 = time.perf_counter()
    log = EventLog(path)
    for ev in events:
        log.write(ev)
    log.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    events = [StepMetrics(epoch=1, step=i, global_step=i, steps_per_epoch=10**6, loss=0.5,
                          samples_per_s=1e4, step_time_s=0.01, lr=0.1)
              for i in range(args.events)]
    old, new = [], []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.rounds):
            order = [("old", _old), ("new", _new)]
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                path = Path(tmp) / f"{name}-{r}.jsonl"
                seconds = fn(path, events)
                (old if name == "old" else new).append(args.events / seconds)
                path.unlink()
    m_old, m_new = statistics.median(old), statistics.median(new)
    print(f"old (buffered text file, write + flush): {m_old:,.0f} events/s")
    print(f"new (EventLog, os.write, cut back):      {m_new:,.0f} events/s")
    print(f"ratio new/old: {m_new / m_old:.2f}")


if __name__ == "__main__":
    main()
