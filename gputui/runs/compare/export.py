"""A comparison's exports for a report: tables as CSV, Markdown or JSON; PNG plots (curves,
speedup, the scaling waterfall); TensorBoard scalars.

Tables are lists of plain dicts with a column order. CSV and JSON keep raw numbers (so they
parse back exactly); Markdown shows them formatted for reading. PNG plots need matplotlib
(the ``plots`` extra); TensorBoard needs tensorboardX (the ``tensorboard`` extra) or torch's
own writer. Each missing extra raises :class:`ExportError` with one line saying what to
install, worded as docs/commands.md says it (:func:`install_hint`). Nothing here imports torch
unless TensorBoard export asks for torch's writer.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Iterable

from gputui.core.errors import UserError
from gputui.core.events import EpochEnd, StepMetrics
from gputui.core.filewrite import WriteFailed, write_with
from gputui.core.scores import perplexity
from gputui.runs.compare.cells import cell
from gputui.runs.compare.table import CompareRow
from gputui.runs.compare.waterfall import LABELS
from gputui.core import runstore

FORMATS = ("table", "csv", "md", "json")


def install_hint(extra: str) -> str:
    """How to install one of gputui's extras, installed or from a clone (as docs/commands.md
    says)."""
    return (f"pip install 'gputui[{extra}]' (in a clone: .venv/bin/pip install -e "
            f"'.[{extra}]')")


class ExportError(UserError, RuntimeError):
    """An export that cannot be made here; the message is one line with the fix."""


def to_csv(rows: list[dict[str, Any]], columns: Iterable[str]) -> str:
    """CSV text with a header line; None becomes an empty cell, lists are joined with ' '."""
    columns = list(columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_cell(row.get(k)) for k in columns})
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return value


def to_markdown(rows: list[dict[str, Any]], columns: Iterable[str]) -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned, cells formatted)."""
    columns = list(columns)
    numeric = {c for c in columns if any(isinstance(r.get(c), (int, float)) for r in rows)}
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---:" if c in numeric else "---" for c in columns) + "|"]
    for row in rows:
        cells = [cell(c, row).replace("|", "\\|") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(data: Any) -> str:
    """Indented JSON, keys sorted (stable for diffs)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def render(rows: list[dict[str, Any]], columns: Iterable[str], form: str) -> str:
    """One of the file formats: csv, md or json."""
    if form == "csv":
        return to_csv(rows, columns)
    if form == "md":
        return to_markdown(rows, columns)
    if form == "json":
        return to_json(rows)
    raise ValueError(f"unknown format {form!r}; use one of csv, md, json")


# ------------------------------------------------------------------ plots
def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ExportError(f"PNG plots need matplotlib: {install_hint('plots')}") from None
    matplotlib.use("Agg")  # files only: never open a window or need a display
    import matplotlib.pyplot as plt

    return plt


def _label(item: CompareRow) -> str:
    r = item.row
    return f"{r.strategy} x{r.devices or '?'} ({r.id[-4:]})"


def plot_curves(items: list[CompareRow], path: str | Path) -> Path:
    """Training loss (left) and the score (right: test accuracy, or a language model's
    validation loss, with its unigram baseline dashed) of every run, overlaid, as a PNG."""
    plt = _pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    lm = {it.row.task for it in items} == {"lm"}
    for it in items:
        if it.loss_curve:
            ax_loss.plot(*zip(*it.loss_curve, strict=True), label=_label(it))
        if it.acc_curve:  # accuracy in percent, as every table and screen shows it
            scale = 1.0 if it.row.task == "lm" else 100.0
            ax_acc.plot([e for e, _ in it.acc_curve], [v * scale for _, v in it.acc_curve],
                        marker="o", label=_label(it))
    baselines = {it.row.baseline_loss for it in items if it.row.baseline_loss is not None}
    if lm and len(baselines) == 1:
        ax_acc.axhline(baselines.pop(), linestyle="--", color="grey", label="unigram baseline")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    score = "validation loss (nats/token)" if lm else "test accuracy (%)"
    if not lm and any(it.row.task == "lm" for it in items):
        score = "test accuracy (%) or validation loss (nats/token)"
    ax_acc.set(xlabel="epoch", ylabel=score, title=score)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    return _save(fig, plt, path)


def plot_speedup(items: list[CompareRow], path: str | Path) -> Path:
    """Speedup against the device count, one line per strategy, with the ideal line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    by_strategy: dict[str, list[tuple[int, float]]] = {}
    for it in items:
        if it.speedup is not None and it.row.devices and not it.flags and not it.noisy:
            by_strategy.setdefault(it.row.strategy, []).append((it.row.devices, it.speedup))
    top = max([n for pts in by_strategy.values() for n, _ in pts] or [1])
    ax.plot([1, top], [1, top], linestyle="--", color="grey", label="ideal")
    for name, pts in sorted(by_strategy.items()):
        pts.sort()
        ax.plot([n for n, _ in pts], [s for _, s in pts], marker="o", label=name)
    ax.set_xticks(sorted({1, top} | {n for pts in by_strategy.values() for n, _ in pts}))
    ax.set(xlabel="devices", ylabel="speedup (samples/s vs one device)",
           title="speedup against devices")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, plt, path)


def _save(fig, plt, path: str | Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        # atomic: a full disk leaves the previous plot and no temporary file (WriteFailed)
        return write_with(path, lambda fh: fig.savefig(fh, format="png", dpi=100))
    except WriteFailed:
        raise
    except OSError as exc:
        raise WriteFailed(path.parent, exc) from None
    finally:
        plt.close(fig)


# ------------------------------------------------------------------ TensorBoard
WATERFALL_COLORS = {"comm": "tab:red", "straggler": "tab:orange", "bubble": "tab:purple",
          "turns": "tab:grey", "data": "goldenrod", "host": "tab:pink",
          "contention": "tab:brown", "unexplained": "lightgrey"}


def plot_waterfall(items: list[CompareRow], path: str | Path) -> Path | None:
    """waterfall.png: every run with a waterfall, side by side (None: no run has one): its
    ideal speedup, each cause's loss as a floating bar from where the previous left off, and
    the measured speedup (``gputui.runs.compare.waterfall``)."""
    runs = [it for it in items if it.waterfall is not None]
    if not runs:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    for ax, it in zip(axes[0], runs, strict=True):
        wf = it.waterfall
        assert wf is not None
        # (name, bottom, height, colour, the figure written over the bar)
        bars = [("ideal", 0.0, wf.ideal, "tab:green", f"{wf.ideal:.2f}x")]
        level = wf.ideal
        for cause, lost in wf.bars:
            if abs(lost) < 0.005 and cause != "unexplained":
                continue
            bars.append((LABELS[cause], min(level, level - lost), abs(lost),
                         WATERFALL_COLORS[cause] if lost >= 0 else "tab:cyan", f"{-lost:+.2f}"))
            level -= lost
        bars.append(("measured", 0.0, wf.measured, "tab:blue", f"{wf.measured:.2f}x"))
        xs = range(len(bars))
        ax.bar(xs, [b[2] for b in bars], bottom=[b[1] for b in bars],
               color=[b[3] for b in bars])
        for x, (_, low, height, _, text) in zip(xs, bars, strict=True):
            ax.text(x, low + height, text, ha="center", va="bottom", fontsize="x-small")
        names = [b[0] for b in bars]
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize="small")
        ax.set(ylabel="speedup (x, vs its one-device baseline)",
               title=f"{_label(it)} vs {it.baseline[-4:]}")
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def _summary_writer():
    try:
        from tensorboardX import SummaryWriter  # no torch needed
        return SummaryWriter
    except ImportError:
        pass
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        return SummaryWriter
    except ImportError:
        raise ExportError(f"TensorBoard export needs tensorboardX: "
                          f"{install_hint('tensorboard')}") from None


def to_tensorboard(run_dirs: list[str | Path], logdir: str | Path) -> list[Path]:
    """Each run's scalars (loss per step; accuracy, or a language model's validation loss,
    perplexity and tokens/s; epoch time, samples/s per epoch) under
    ``logdir/<run id>``; returns the folders written."""
    writer_cls = _summary_writer()
    out = []
    for run_dir in map(Path, run_dirs):
        try:
            events = runstore.read_events(run_dir)
        except OSError:  # an unreadable record has nothing to plot (compare's table says why)
            continue
        target = Path(logdir) / run_dir.name
        writer = writer_cls(log_dir=str(target))
        try:
            for ev in events:
                if isinstance(ev, StepMetrics):
                    writer.add_scalar("train/loss", ev.loss, ev.global_step, walltime=ev.t)
                    writer.add_scalar("train/samples_per_s", ev.samples_per_s, ev.global_step,
                                      walltime=ev.t)
                    if ev.tokens_per_s:
                        writer.add_scalar("train/tokens_per_s", ev.tokens_per_s,
                                          ev.global_step, walltime=ev.t)
                elif isinstance(ev, EpochEnd):
                    lm = ev.task == "lm"
                    score = ((("val/loss", ev.val_loss), ("val/perplexity",
                                                          perplexity(ev.val_loss)),
                              ("epoch/tokens_per_s", ev.tokens_per_s))
                             if lm else (("test/accuracy", ev.test_acc),
                                         ("test/loss", ev.test_loss)))
                    for tag, value in (*score, ("epoch/seconds", ev.seconds),
                                       ("epoch/samples_per_s", ev.samples_per_s)):
                        if value is not None:
                            writer.add_scalar(tag, value, ev.epoch, walltime=ev.t)
        finally:
            writer.close()
        out.append(target)
    return out
