"""Where a step's time goes: the parts of one metered step, per device, and how they are shown.

A :class:`Breakdown` holds the seconds of one metered step of one device (or rank):

- ``data_s``: waiting for the batch (the loop's fetch of the next batch, host time);
- ``compute_s``: forward and backward of this device, up to the moment its last gradient is
  ready (DDP: the last bucket's launch);
- ``comm_exposed_s``: communication the step waits for after compute (DDP: from the last
  bucket's launch to the end of the all-reduce wait; fsdp on the CPU: its all-gathers and
  reduce-scatters, which block the training thread; scratch: the hand-written allreduce;
  model_parallel: the activation and gradient moves); ``None`` where the strategy's
  communication runs inside calls gputui cannot split (dp on GPUs, fsdp on GPUs, where its
  collectives' overlap with compute is not known), counted in compute;
- ``optimizer_s``: the update (and the grad scaler's);
- ``wait_s``: devices driven in turn by one process (CPU virtual devices of scratch and
  model_parallel): the time this device waits while the others compute;
- ``host_s``: what remains of the step (Python, zero_grad, sharding, kernel launches).

Those six add up to ``step_s``. ``comm_overlap_s`` is communication hidden behind compute
(DDP's buckets all-reduced while backward still runs): it lies inside ``compute_s`` and is
not added again. Torch-free: the printer, the app and compare use it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

# the parts that add up to step_s, in the order they are shown
PARTS = ("compute_s", "comm_exposed_s", "optimizer_s", "data_s", "wait_s", "host_s")
LABELS = {"compute_s": "compute", "comm_exposed_s": "comm", "optimizer_s": "optim",
          "data_s": "data", "wait_s": "wait", "host_s": "host", "comm_overlap_s": "hidden"}
# one character per part for the stacked bar (and a style for the app)
GLYPHS = {"compute_s": "█", "comm_exposed_s": "▓", "optimizer_s": "▒", "data_s": "░",
          "wait_s": "·", "host_s": " "}
STYLES = {"compute_s": "green", "comm_exposed_s": "red", "optimizer_s": "blue",
          "data_s": "yellow", "wait_s": "grey50", "host_s": "magenta"}
# the share columns of compare's tables and exports
SHARE_COLUMNS = ("compute_share", "comm_exposed_share", "comm_overlap_share", "optimizer_share",
                 "data_share", "host_share")


@dataclass(frozen=True)
class Breakdown:
    """One device's metered step, in seconds (see the module doc): the parts in ``PARTS``
    add up to ``step_s``; ``comm_overlap_s`` lies inside ``compute_s``. A part that could not
    be measured is None. Built by :func:`make`."""

    step_s: float
    data_s: float
    compute_s: float
    comm_exposed_s: float | None
    optimizer_s: float
    wait_s: float
    host_s: float
    comm_overlap_s: float | None

    def part(self, name: str) -> float | None:
        """The part called ``name`` (one of ``PARTS``, or "comm_overlap_s" / "step_s")."""
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        """The record's form: every part by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Breakdown:
        """From the record's form (parts a record lacks are None; unknown keys ignored)."""
        def get(key: str) -> float:
            value = _seconds(data.get(key))
            if value is None:
                raise TypeError(f"the step part {key} is missing")
            return value

        return cls(step_s=get("step_s"), data_s=get("data_s"), compute_s=get("compute_s"),
                   comm_exposed_s=_seconds(data.get("comm_exposed_s")),
                   optimizer_s=get("optimizer_s"), wait_s=get("wait_s"), host_s=get("host_s"),
                   comm_overlap_s=_seconds(data.get("comm_overlap_s")))


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a step part must be seconds, not {value!r}")
    return float(value)


def make(span_s: float, data_s: float, compute_s: float, optimizer_s: float,
         comm_exposed_s: float | None = 0.0, comm_overlap_s: float | None = 0.0,
         wait_s: float = 0.0) -> Breakdown:
    """The breakdown of one step: ``span_s`` is the strategy's step (from the start of
    train_step to the end of the update), ``data_s`` the wait for its batch before it. The
    remainder is ``host_s``; where the parts measured on a device's clock exceed the host's
    span (CUDA events against perf_counter), host is 0 and the step is their sum."""
    data, compute = max(0.0, data_s), max(0.0, compute_s)
    exposed = None if comm_exposed_s is None else max(0.0, comm_exposed_s)
    optimizer, wait = max(0.0, optimizer_s), max(0.0, wait_s)
    known = data + compute + (exposed or 0.0) + optimizer + wait
    host = max(0.0, data + max(0.0, span_s) - known)
    return Breakdown(step_s=known + host, data_s=data, compute_s=compute,
                     comm_exposed_s=exposed, optimizer_s=optimizer, wait_s=wait, host_s=host,
                     comm_overlap_s=None if comm_overlap_s is None else max(0.0, comm_overlap_s))


def total(bd: Breakdown) -> float:
    """The sum of the parts (equals ``bd.step_s``)."""
    return sum(bd.part(k) or 0.0 for k in PARTS)


def mean(breakdowns: Iterable[Breakdown | None]) -> Breakdown | None:
    """The part-by-part mean of several breakdowns (devices of one step, or steps of one run);
    a part no breakdown measured stays None (step_s and the always-measured parts are 0.0
    then). None when there is none."""
    items = [b for b in breakdowns if b]
    if not items:
        return None

    def avg(key: str) -> float | None:
        values = [v for v in (b.part(key) for b in items) if v is not None]
        return sum(values) / len(values) if values else None

    return Breakdown(step_s=avg("step_s") or 0.0, data_s=avg("data_s") or 0.0,
                     compute_s=avg("compute_s") or 0.0, comm_exposed_s=avg("comm_exposed_s"),
                     optimizer_s=avg("optimizer_s") or 0.0, wait_s=avg("wait_s") or 0.0,
                     host_s=avg("host_s") or 0.0, comm_overlap_s=avg("comm_overlap_s"))


def mean_value(values: Iterable[float | None]) -> float | None:
    """The mean of the figures that were measured (None where none was)."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def shares(bd: Breakdown | None) -> dict[str, float | None]:
    """Each part as a share of the step (``SHARE_COLUMNS``, a table's row); wait counts as
    host here."""
    if not bd or not bd.step_s:
        return {k: None for k in SHARE_COLUMNS}
    step = bd.step_s

    def share(*keys: str) -> float | None:
        values = [bd.part(k) for k in keys]
        if all(v is None for v in values):
            return None
        return sum(v or 0.0 for v in values) / step

    return {"compute_share": share("compute_s"), "comm_exposed_share": share("comm_exposed_s"),
            "comm_overlap_share": share("comm_overlap_s"), "optimizer_share": share("optimizer_s"),
            "data_share": share("data_s"), "host_share": share("host_s", "wait_s")}


def line(bd: Breakdown | None) -> str:
    """A compact line: 'step 12.3 ms: compute 71% · comm 9% (+4% hidden) · optim 8% · ...'
    (parts under 0.5 % left out, but comm always where measured, 'comm 0%' included)."""
    if not bd or not bd.step_s:
        return "no metered step yet"
    step = bd.step_s
    out = []
    for key in PARTS:
        value = bd.part(key)
        if value is None:
            continue
        pct = 100.0 * value / step
        if key == "comm_exposed_s":
            hidden = bd.comm_overlap_s
            extra = f" (+{100.0 * hidden / step:.0f}% hidden)" if hidden else ""
            out.append(f"comm {pct:.0f}%{extra}")
        elif pct >= 0.5:
            out.append(f"{LABELS[key]} {pct:.0f}%")
    return f"step {step * 1000:.1f} ms: " + " · ".join(out)


def bar(bd: Breakdown | None, width: int) -> list[tuple[str, str]]:
    """A stacked bar ``width`` characters wide: (text, style) segments, one per part, each as
    long as its share of the step (rounded so that the segments fill the bar)."""
    if not bd or not bd.step_s or width <= 0:
        return [("─" * max(0, width), "grey37")]
    step, edge, out, acc = bd.step_s, 0, [], 0.0
    for key in PARTS:
        acc += (bd.part(key) or 0.0) / step
        end = min(width, round(acc * width))
        if end > edge:
            glyph = GLYPHS[key] if key != "host_s" else "▔"
            out.append((glyph * (end - edge), STYLES[key]))
            edge = end
    if edge < width:
        out.append(("▔" * (width - edge), STYLES["host_s"]))
    return out


def pipeline_line(row: Any) -> str | None:
    """A pp stage's pipeline figures of its metered step (a ``gputui.core.events.DeviceStep``
    from ``gputui.train.strategies.pp_meter``), e.g. 'stage 0: bubble 41% of the pipeline
    (theory 20%) · sends 1.2 ms · receives 1.1 ms'; None for a row of another strategy."""
    share = getattr(row, "bubble_share", None)
    if share is None:
        return None
    text = f"stage {row.stage}: bubble {share:.0%} of the pipeline"
    if row.bubble_theory is not None:
        text += f" (theory {row.bubble_theory:.0%})"
    return (text + f" · sends {1000 * (row.send_s or 0.0):.1f} ms · receives "
            f"{1000 * (row.recv_s or 0.0):.1f} ms")


def recompute_line(row: Any) -> str | None:
    """Activation checkpointing's recomputation on the metered step, e.g. 'recompute 4.2 ms
    (12% of the step), inside backward'; None where nothing was recomputed."""
    seconds = getattr(row, "recompute_s", None)
    if not seconds:
        return None
    step = row.breakdown.step_s if getattr(row, "breakdown", None) is not None else None
    share = f" ({100 * seconds / step:.0f}% of the step)" if step else ""
    return f"recompute {1000 * seconds:.1f} ms{share}, inside backward"


def collectives_line(row: Any) -> str | None:
    """The metered step's collectives by name, e.g. 'tp all-reduce 3.1 ms · fsdp all-gather
    1.2 ms · fsdp reduce-scatter 0.8 ms' (seconds each kind was in flight; pp's sends and
    receives estimated); None for a row that named none."""
    kinds = getattr(row, "collectives", None)
    if not kinds:
        return None
    sent = getattr(row, "collective_bytes", None) or {}  # ep's all-to-alls count their bytes
    return " · ".join(f"{kind} {1000 * float(seconds):.1f} ms"
                      + (f" {_kib(sent[kind])}" if sent.get(kind) else "")
                      for kind, seconds in kinds.items())


def _kib(n: int) -> str:
    """Bytes sent, in KiB or MiB: '96 KiB', '1.5 MiB'."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"
