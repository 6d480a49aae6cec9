"""A run's measured allocator peak against the memory its model predicts, per device.

The memory model (``gputui.runs.predict.scaling.memory``) adds four terms for a device: parameters,
gradients, optimizer state and the activations saved for backward. A run counts each of them
on its own tensors (``MemoryReport``: the parameters, gradients and state a device holds, a
shard its own share, and the peak of the activations on the first step); on CUDA it also
reports the allocator's peak since the epoch began. What the allocator took beyond the
terms (``diff``: peak minus predicted, positive when the model under-counts) is workspace,
fragmentation, temporaries and the CUDA caching allocator's rounding: the part a prediction
from the terms alone cannot see. Pure: a function of the run's events (summary.json keeps it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gputui.core.events import Event, MemoryReport

def memory_check(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Per device with an allocator peak: {"device", "peak", "predicted", "diff"} (bytes),
    the peak over every MemoryReport, the terms of the last one that counted them."""
    peak: dict[str, int] = {}
    predicted: dict[str, int] = {}
    for ev in events:
        if not isinstance(ev, MemoryReport):
            continue
        for row in ev.per_device:
            if not row.device:
                continue
            if row.peak is not None:
                peak[row.device] = max(peak.get(row.device, 0), row.peak)
            terms = row.predicted()
            if terms is not None:
                predicted[row.device] = terms
    return [{"device": d, "peak": peak[d], "predicted": predicted[d],
             "diff": peak[d] - predicted[d]} for d in peak if d in predicted]
