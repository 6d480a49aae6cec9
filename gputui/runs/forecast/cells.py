"""A plan's figures as text, the same in `gputui plan`'s table and in the app's plan screen
(torch-free): durations in the unit that shows them, memory in GiB, a row's cells."""

from __future__ import annotations

from gputui.runs.forecast.estimate import GIB, Row, label_of

# (label, key) of the plan's table, read first on the left: a narrow terminal cuts the rest
COLUMNS = [("#", "n"), ("strategy", "strategy"), ("mesh", "mesh"), ("zero", "zero"),
           ("ac", "ac"), ("fits", "fits"), ("step", "step"), ("tok/s", "tokens"),
           ("MFU", "mfu"), ("peak", "peak"), ("params", "params"), ("grads", "grads"),
           ("optim", "optim"), ("act", "act"), ("temp+buf", "temps"), ("comm", "comm")]


def seconds(s: float | None) -> str:
    """A duration in the unit that shows it with 3 significant figures: 1.21 s, 278 ms,
    96.5 µs (a step of a small model on a GPU is well under a millisecond)."""
    if s is None:
        return "-"
    if s <= 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if float(f"{s / scale:.3g}") >= 1:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def origin(c: dict) -> str:
    """Where a collective's figures come from, beside its time: '' (traced, the ring's time),
    formula (not traced: DDP's buckets, pp's sends) and the time measured in the mesh's step
    on this machine's CPU ranks (``gputui.runs.forecast.links``)."""
    if c.get("measured"):
        return " (formula; its time measured in the step)" if c.get("formula") else \
            " (time measured in the step)"
    return " (formula)" if c.get("formula") else ""


def gib(n: int | None) -> str:
    """Bytes as GiB with two decimals ('-' for none)."""
    return f"{n / GIB:.2f}" if n else "-"


def row_cells(row: Row, number: str) -> dict[str, str]:
    """``row``'s cells by the keys of :data:`COLUMNS` (``number``: its '#', a '*' on the
    Pareto front); a mesh with no figures has '-' for every one."""
    mem = row.mem
    s = row.shape
    cells = {"n": number, "strategy": row.strategy, "mesh": s.describe(),
             "zero": str(s.zero) if s.dp_shard > 1 else "-", "ac": s.ac}
    if not row.peak:  # (every other column, "fits" among them: one '-' each)
        return {**{k: "-" for _, k in COLUMNS}, **cells}
    return dict(cells, fits="yes" if row.fits else "no",
                step=seconds(row.step_s) if row.step_s else "-",
                tokens=f"{row.tokens_per_s:,.0f}" if row.tokens_per_s else "-",
                mfu=f"{row.mfu:.0%}" if row.mfu else "-", peak=gib(row.peak),
                params=gib(mem["params"] + mem["gathered"]), grads=gib(mem["grads"]),
                optim=gib(mem["optim"]), act=gib(mem["activations"]),
                temps=gib(mem["temps"] + mem["buffers"]), comm=seconds(row.comm_exposed_s))


def row_line(row: Row, measured_after: bool) -> str:
    """A mesh's row in one line, told as soon as it is traced (the table comes when every
    mesh is): its peak per rank, whether it fits and its step; ``measured_after``: the plan
    measures this row's collectives after the last mesh (``links.will_measure``), so the
    step is the formula's until then."""
    fit = "fits" if row.fits else "does not fit"
    text = f"  = {label_of(row.shape)}: peak {gib(row.peak)} GiB, {fit}"
    if row.step_s:
        text += f", {seconds(row.step_s)} a step"
        if measured_after:
            text += " (its collectives measured after the last mesh)"
    return text
