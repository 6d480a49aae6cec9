"""Where a step's time goes: the parts of one metered step, per device, and how they are shown.

A breakdown is a plain dict of seconds for one metered step of one device (or rank):

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


def make(span_s: float, data_s: float, compute_s: float, optimizer_s: float,
         comm_exposed_s: float | None = 0.0, comm_overlap_s: float | None = 0.0,
         wait_s: float = 0.0) -> dict[str, Any]:
    """The breakdown of one step: ``span_s`` is the strategy's step (from the start of
    train_step to the end of the update), ``data_s`` the wait for its batch before it. The
    remainder is ``host_s``; where the parts measured on a device's clock exceed the host's
    span (CUDA events against perf_counter), host is 0 and the step is their sum."""
    parts = {"data_s": max(0.0, data_s), "compute_s": max(0.0, compute_s),
             "comm_exposed_s": None if comm_exposed_s is None else max(0.0, comm_exposed_s),
             "optimizer_s": max(0.0, optimizer_s), "wait_s": max(0.0, wait_s)}
    known = sum(v for v in parts.values() if v is not None)
    step = max(0.0, data_s) + max(0.0, span_s)
    host = max(0.0, step - known)
    parts["host_s"] = host
    parts["step_s"] = known + host
    parts["comm_overlap_s"] = None if comm_overlap_s is None else max(0.0, comm_overlap_s)
    return parts


def total(bd: dict[str, Any]) -> float:
    """The sum of the parts (equals ``bd["step_s"]``)."""
    return sum(bd.get(k) or 0.0 for k in PARTS)


def mean(breakdowns: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The part-by-part mean of several breakdowns (devices of one step, or steps of one run);
    a part no breakdown measured stays None. None when there is none."""
    items = [b for b in breakdowns if b]
    if not items:
        return None
    out: dict[str, Any] = {}
    for key in ("step_s", *PARTS, "comm_overlap_s"):
        values = [b[key] for b in items if b.get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def mean_of(rows: Iterable[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the rows that have it (None where none has)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def shares(bd: dict[str, Any] | None) -> dict[str, float | None]:
    """Each part as a share of the step (``SHARE_COLUMNS``); wait counts as host here."""
    if not bd or not bd.get("step_s"):
        return {k: None for k in SHARE_COLUMNS}
    step = bd["step_s"]

    def share(*keys: str) -> float | None:
        values = [bd.get(k) for k in keys]
        if all(v is None for v in values):
            return None
        return sum(v or 0.0 for v in values) / step

    return {"compute_share": share("compute_s"), "comm_exposed_share": share("comm_exposed_s"),
            "comm_overlap_share": share("comm_overlap_s"), "optimizer_share": share("optimizer_s"),
            "data_share": share("data_s"), "host_share": share("host_s", "wait_s")}


def line(bd: dict[str, Any] | None) -> str:
    """A compact line: 'step 12.3 ms: compute 71% · comm 9% (+4% hidden) · optim 8% · ...'
    (parts under 0.5 % left out, but comm always where measured, 'comm 0%' included)."""
    if not bd or not bd.get("step_s"):
        return "no metered step yet"
    step = bd["step_s"]
    out = []
    for key in PARTS:
        value = bd.get(key)
        if value is None:
            continue
        pct = 100.0 * value / step
        if key == "comm_exposed_s":
            hidden = bd.get("comm_overlap_s")
            extra = f" (+{100.0 * hidden / step:.0f}% hidden)" if hidden else ""
            out.append(f"comm {pct:.0f}%{extra}")
        elif pct >= 0.5:
            out.append(f"{LABELS[key]} {pct:.0f}%")
    return f"step {step * 1000:.1f} ms: " + " · ".join(out)


def bar(bd: dict[str, Any] | None, width: int) -> list[tuple[str, str]]:
    """A stacked bar ``width`` characters wide: (text, style) segments, one per part, each as
    long as its share of the step (rounded so that the segments fill the bar)."""
    if not bd or not bd.get("step_s") or width <= 0:
        return [("─" * max(0, width), "grey37")]
    step, edge, out, acc = bd["step_s"], 0, [], 0.0
    for key in PARTS:
        acc += (bd.get(key) or 0.0) / step
        end = min(width, round(acc * width))
        if end > edge:
            glyph = GLYPHS[key] if key != "host_s" else "▔"
            out.append((glyph * (end - edge), STYLES[key]))
            edge = end
    if edge < width:
        out.append(("▔" * (width - edge), STYLES["host_s"]))
    return out


def pipeline_line(row: dict[str, Any]) -> str | None:
    """A pp stage's pipeline figures of its metered step (a per_device row from
    ``gputui.train.strategies.pp_meter``), e.g. 'stage 0: bubble 41% of the pipeline (theory
    20%) · sends 1.2 ms · receives 1.1 ms'; None for a row of another strategy."""
    if row.get("bubble_share") is None:
        return None
    text = f"stage {row.get('stage', '?')}: bubble {row['bubble_share']:.0%} of the pipeline"
    if row.get("bubble_theory") is not None:
        text += f" (theory {row['bubble_theory']:.0%})"
    return (text + f" · sends {1000 * (row.get('send_s') or 0.0):.1f} ms · receives "
            f"{1000 * (row.get('recv_s') or 0.0):.1f} ms")
