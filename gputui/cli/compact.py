"""The compact table that `gputui compare` and `gputui sweep` print by default: the columns a
user reads first, each header carrying its unit so the cells are bare numbers, fitting 100
columns without cutting a header or wrapping a unit onto a second row. ``--wide`` prints every
column (``gputui.runs.compare.table.TABLE_COLUMNS``); csv, md and json always carry them all.
"""

from __future__ import annotations

import re
from typing import Any

# the run's id without its date and time (the rest is a unique part of it: `compare` takes it)
COLUMNS = ("run", "strategy", "devices", "time_per_epoch_s", "samples_per_s", "speedup",
           "efficiency", "test_acc")
HEADERS = {"run": "run", "strategy": "strategy", "devices": "devices", "fast": "fast path",
           "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s",
           "tokens_per_s": "tokens/s", "speedup": "speedup (x)", "efficiency": "eff. (%)",
           "test_acc": "acc (%)", "val_loss": "val loss"}
_STAMP = re.compile(r"^\d{8}-\d{6}-")


def columns(rows: list[dict[str, Any]], fast: bool = False) -> tuple[str, ...]:
    """The compact columns for these rows: a sweep over fast-path axes names each run's fast
    path; language models show val loss (nats per token) and tokens/s where classifiers show
    accuracy and samples/s (a table of both kinds, both)."""
    tasks = {r.get("task") or "classify" for r in rows} or {"classify"}
    out: list[str] = []
    for c in COLUMNS:
        if c == "devices" and fast:
            out += ["devices", "fast"]
        elif c == "samples_per_s":
            out += ["samples_per_s"] if "classify" in tasks else ["tokens_per_s"]
        elif c == "test_acc":
            out += (["test_acc"] if "classify" in tasks else []) + \
                (["val_loss"] if "lm" in tasks else [])
        else:
            out.append(c)
    return tuple(out)


def cell(key: str, row: dict[str, Any]) -> str:
    """A compact cell: the figure in its header's unit, with its noise beside it."""
    value = row.get("id") if key == "run" else row.get(key)
    if value is None or value == "" or value != value:
        return "-"
    if key == "run":
        return _STAMP.sub("", str(value))
    if isinstance(value, str):  # "flagged", "noisy", a strategy, a fast path
        return value
    noise = row.get(f"{key}_noise")
    if key == "speedup":
        return f"{value:.2f}" + (f" ±{noise:.2f}" if noise is not None else "")
    if key == "efficiency":
        return f"{value * 100:.0f}" + (f" ±{noise * 100:.0f}" if noise is not None else "")
    if key == "test_acc":
        return f"{value * 100:.2f}"
    if key == "time_per_epoch_s":
        return f"{value:.2f}"
    if key in ("samples_per_s", "tokens_per_s"):
        return f"{value:,.0f}"
    if key == "val_loss":
        return f"{value:.4f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], cols: tuple[str, ...], title: str) -> None:
    """The compact table on stdout: headers on one row, never cut; only the run and fast-path
    columns fold (never cut) when the terminal is too narrow for them."""
    import sys

    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # one space of padding on the right of each column, plus the box's space between: a gap
    # of 2, and none at the edges
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))
    for c in cols:
        table.add_column(HEADERS[c], no_wrap=c not in ("run", "fast"), overflow="fold",
                         justify="left" if c in ("run", "strategy", "fast") else "right")
    for r in rows:
        table.add_row(*(Text(cell(c, r)) for c in cols))
    # off a terminal (a log, a pipe) rich would wrap at 80 columns; keep rows whole
    Console(width=None if sys.stdout.isatty() else 240).print(table)


def add_wide(p) -> None:
    """--wide, as compare and sweep take it."""
    p.add_argument("--wide", action="store_true",
                   help="print every column (where a step's time goes, mfu, memory, init, "
                        "status, baseline...), not just the compact table")


def print_compact(items, title: str, fast: bool = False) -> None:
    """The compact table of compared runs (``gputui.runs.compare.table.CompareRow`` items)."""
    from gputui.runs.compare.table import table_rows

    wanted = ("id", "task", *(c for c in COLUMNS + ("fast", "tokens_per_s", "val_loss")
                              if c != "run"))
    rows = table_rows(items, wanted)
    print_table(rows, columns(rows, fast), title)
