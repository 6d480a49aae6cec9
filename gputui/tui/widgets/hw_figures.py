"""A device panel's training figures: the MFU gauge (the run's achieved FLOP/s over the peak
of its devices, beside the utilization the device reports) and the device's own training
memory (parameters, gradients, optimizer state, activations; CUDA's allocator), beside the
memory the device reports."""

from __future__ import annotations

from textual.widgets import Static

from gputui.core.events import MemoryRow


def short_bytes(n: int | None) -> str:
    """516272 -> '504 KiB', 28852228 -> '27.5 MiB' (binary units, three figures at most)."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def flops_text(flops_per_s: float | None) -> str:
    """3.1e12 -> '3.1 TFLOP/s'."""
    if flops_per_s is None:
        return "n/a"
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.1f} {unit}FLOP/s"
    return f"{flops_per_s:.0f} FLOP/s"


def show_mfu(meter, mfu: float | None) -> None:
    """The run's model FLOP utilization on a device panel's ``Meter``: achieved FLOP/s over
    the devices' peak, as a bar."""
    meter.fraction = min(max(mfu, 0.0), 1.0) if mfu is not None else None
    meter.value_text = f"{mfu * 100:5.1f}%" if mfu is not None else "n/a"
    meter.refresh()


class TrainMemory(Static):
    """The device's own training memory, from the run's MemoryReport rows."""

    def __init__(self) -> None:
        super().__init__("train mem n/a", classes="train-mem")

    def show(self, row: MemoryRow) -> None:
        self.update(memory_text(row))


def memory_text(row: MemoryRow) -> str:
    """Two lines that fit a device panel, each figure with its unit:
    'params 504 KiB · grads 504 KiB' / 'optim 504 KiB · activ. 27.5 MiB', and on CUDA a third
    with the allocator's figures and its peak against the memory model's terms:
    'torch 1.2 GiB · peak 3.4 GiB vs 3.0 GiB predicted (+0.4 GiB)'."""
    experts = f" (experts {short_bytes(row.experts)})" if row.experts else ""
    text = (f"params {short_bytes(row.params)}{experts} · grads {short_bytes(row.grads)}\n"
            f"optim {short_bytes(row.optim)} · activ. {short_bytes(row.activations)}")
    if row.alloc is not None:
        text += f"\ntorch {short_bytes(row.alloc)} · peak {short_bytes(row.peak)}"
        predicted = row.predicted()  # the memory model's terms (gputui.core.memcheck)
        if row.peak is not None and predicted is not None:  # what the peak took beyond them
            diff = row.peak - predicted
            text += (f" vs {short_bytes(predicted)} predicted "
                     f"({'+' if diff >= 0 else '-'}{short_bytes(abs(diff))})")
    return text


def flops_line(info) -> str:
    """The log's line for a FlopsInfo: one step's cost and the peak the MFU is measured against."""
    peak = flops_text(info.peak_flops) if info.peak_flops else "unknown"
    units = f" for {info.units} devices" if info.units > 1 else ""
    active = getattr(info, "params_active", 0)
    moe = (f" over the {active:,} active parameters (of {info.params_total:,}: top-k experts "
           f"a token)" if active else "")
    return (f"{info.flops_per_step / 1e9:,.2f} GFLOP per step (forward and backward){moe}; "
            f"peak {peak} {info.dtype}{units} ({info.source}): the panels' mfu is the share "
            f"reached")

