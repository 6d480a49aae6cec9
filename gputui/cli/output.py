"""How the table-printing commands print: a rich table on the terminal, or csv/md/json to
stdout or a file (written atomically). Shared by runs, compare, sweep and predict.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gputui.core import scores
from gputui.core.filewrite import WriteFailed, write_atomic

HEADERS = {"time_per_epoch_s": "time/epoch", "samples_per_s": "samples/s", "test_acc": "test acc",
           "comm_share": "comm", "bubble_share": "bubble", "init_s": "init",
           "efficiency": "efficiency",
           "step_ms": "step (ms)", "mem_per_device": "mem/device",
           "predicted_speedup": "predicted",
           "compute_share": "compute", "comm_exposed_share": "exposed",
           "comm_overlap_share": "hidden", "optimizer_share": "optim", "data_share": "data",
           "host_share": "host", "train_mem": "train mem", **scores.HEADERS}


def add_output(p: argparse.ArgumentParser) -> None:
    """--format, --json and --output, as every table-printing command takes them."""
    p.add_argument("--format", choices=FORMS,
                   help="table (terminal), csv, md (Markdown) or json (default: table, or "
                        "what --output's suffix names)")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write the csv/md/json there (.csv, .md or .json names the form)")


FORMS = ("table", "csv", "md", "json")
SUFFIXES = {".csv": "csv", ".md": "md", ".json": "json"}


def form_of(args) -> str:
    """The output form a command's --format/--json/--output flags ask for; ConfigError (one
    line) when they disagree or --output would get the terminal's table."""
    from gputui.core.config import ConfigError

    form = getattr(args, "format", None)
    if args.json and form not in (None, "json"):
        raise ConfigError(f"--json and --format {form} ask for two forms; give one")
    form = "json" if args.json else form
    output = getattr(args, "output", None)
    if output is not None and not str(output).strip():
        raise ConfigError("--output: give a file name (leave --output out to print)")
    if output and form is None:
        form = SUFFIXES.get(Path(output).suffix.lower())
        if form is None:
            raise ConfigError(f"--output {output}: say which form to write there: --format "
                              f"csv, md or json (or name a .csv, .md or .json file)")
    if output and form == "table":
        raise ConfigError(f"--output {output}: the table is for the terminal; write --format "
                          f"csv, md or json there")
    return form or "table"


def emit(rows: list[dict[str, Any]], columns, form: str, output: str | None, title: str,
         json_data: Any = None) -> None:
    """Print a table on the terminal, or write csv/md/json to stdout or ``output``."""
    from gputui.runs.compare.export import render, to_json

    if form == "table":
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        # ids, names and reasons come from records and folder names: shown as text, not markup
        table = Table(title=Text(title))
        for c in columns:
            left = c in ("id", "name", "strategy", "status", "date", "baseline")
            table.add_column(HEADERS.get(c, c), no_wrap=c in ("id", "date"),
                             justify="left" if left else "right")
        for r in rows:
            table.add_row(*(Text(_cell(c, r)) for c in columns))
        # Off a terminal (a log, a pipe) rich would wrap at 80 columns; keep rows whole. On a
        # terminal narrower than the table, the table keeps its width (each column whole)
        # rather than squeezing its columns to nothing: a wide table is asked for.
        from rich.measure import Measurement

        console = Console(width=None if sys.stdout.isatty() else 240)
        need = Measurement.get(Console(width=1000), Console(width=1000).options, table).maximum
        Console(width=max(console.width, min(need, 1000))).print(table)
        return
    text = to_json(json_data) if form == "json" and json_data is not None else render(
        rows, columns, form)
    if output:
        try:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteFailed(Path(output).parent, exc) from None
        write_atomic(output, text)  # WriteFailed: one line naming the file
    else:
        sys.stdout.write(text)


def _cell(key: str, row: dict[str, Any]) -> str:
    from gputui.runs.compare.cells import cell

    value = row.get(key)
    if key == "baseline" and value:  # the full id is in the id column; its suffix finds it
        return "…" + str(value).rsplit("-", 1)[-1]
    return cell(key, row)
