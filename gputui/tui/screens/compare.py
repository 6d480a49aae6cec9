"""The compare view: the comparison table of one or more recorded runs, their loss and
accuracy curves overlaid, and how each speedup was measured.

One run is "a past run with its plots"; several are a comparison. The records are read in a
thread worker; the handler fills the table and the plots.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from gputui.core import scores
from gputui.runs.compare import waterfall
from gputui.runs.compare.cells import cell
from gputui.runs.compare.table import (TABLE_COLUMNS, CompareRow, compare, summary_lines,
                            table_rows)
from gputui.tui.widgets.overlay_plot import OverlayPlot
from gputui.tui.widgets.plain_table import PlainTable
from gputui.tui.widgets.too_small import TooSmall

HEADERS = {"time_per_epoch_s": "time/epoch", "samples_per_s": "samples/s",
           "test_acc": "test acc", "comm_share": "comm", "bubble_share": "bubble",
           "init_s": "init (s)",
           "predicted_speedup": "predicted",
           "compute_share": "compute", "comm_exposed_share": "exposed",
           "comm_overlap_share": "hidden", "optimizer_share": "optim", "data_share": "data",
           "host_share": "host", "train_mem": "train mem", **scores.HEADERS}


# read first, so they come first: a narrow terminal cuts the others
FIRST = ("id", "strategy", "devices", "speedup", "samples_per_s", "time_per_epoch_s",
         "test_acc", "val_loss", "val_ppl", "efficiency")


def key_first(columns: list[str]) -> list[str]:
    """The table's columns with the ones read first in front, the rest in their order."""
    return [c for c in FIRST if c in columns] + [c for c in columns if c not in FIRST]


class CompareLoaded(Message):
    """The comparison, computed off the UI thread."""

    def __init__(self, items: tuple[CompareRow, ...], error: str = "") -> None:
        super().__init__()
        self.items, self.error = items, error


def label(item: CompareRow) -> str:
    """A short legend entry: strategy, devices and the id's suffix."""
    r = item.row
    return f"{r.strategy or '?'} x{r.devices or '?'} {r.id.rsplit('-', 1)[-1]}"


class CompareScreen(Screen):
    """Runs side by side; escape goes back to the history."""

    # The app's stylesheet belongs to the app; these few rules travel with the screen.
    DEFAULT_CSS = """
    #compare-table { height: auto; max-height: 14; }
    #compare-plots { height: 1fr; min-height: 12; }
    #compare-plots OverlayPlot { width: 1fr; }
    #compare-notes { height: auto; max-height: 8; padding: 0 1; color: $text-muted; }
    #compare-waterfall { height: auto; max-height: 14; padding: 0 1; }
    CompareScreen.-h-small #compare-table { max-height: 5; }
    CompareScreen.-h-small #compare-plots { min-height: 9; }
    CompareScreen.-h-small #compare-notes, CompareScreen.-h-medium #compare-notes {
        max-height: 4;
    }
    CompareScreen.-h-small #compare-waterfall { max-height: 6; }
    """
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "reload", "Reload")]

    def __init__(self, run_dirs: list[Path], runs_dir: str | Path, title: str = "",
                 only_compared: bool = False) -> None:
        super().__init__(classes="compare-screen")
        self.only_compared = only_compared  # a sweep's runs: baselines from the sweep only
        self.run_dirs = [Path(p) for p in run_dirs]
        self.runs_dir = Path(runs_dir)
        self.title_text = title or "comparison"
        self.items: tuple[CompareRow, ...] = ()
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield PlainTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="compare-plots"):
            yield OverlayPlot("Training loss", "epoch", id="compare-loss")
            yield OverlayPlot("Test accuracy (%)", "epoch", id="compare-acc", ylim=(0, 100))
        yield Static("reading the records…", id="compare-notes", markup=False)
        with VerticalScroll(id="compare-waterfall"):  # shown when some run has a waterfall
            yield Static("", id="compare-waterfall-text", markup=False)
        yield Footer()
        yield TooSmall()

    def on_mount(self) -> None:
        self.sub_title = self.title_text
        self.query_one("#compare-waterfall").display = False  # until a run brings one
        table = self.query_one(DataTable)
        for key in key_first(list(TABLE_COLUMNS)):
            table.add_column(HEADERS.get(key, key), key=key)
        self.load()

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False)
    def load(self) -> None:
        """Read the records and compute the comparison off the UI thread."""
        try:
            self.post_message(CompareLoaded(tuple(compare(self.run_dirs, self.runs_dir,
                                                           self.only_compared))))
        except OSError as exc:
            self.post_message(CompareLoaded((), f"cannot read the records: {exc}"))

    def on_compare_loaded(self, message: CompareLoaded) -> None:
        """Fill the table, the overlaid curves and the notes."""
        self.items = message.items
        table = self.query_one(PlainTable)
        # a language model's runs bring their columns (val loss, ppl, tokens/s)
        columns = key_first(list(scores.columns_for(TABLE_COLUMNS,
                                                    [it.row for it in message.items])))
        # a flagged speedup reads "flagged" (gputui.core.trust)
        flat = table_rows(list(message.items), columns)
        table.fill([(HEADERS.get(key, key), key) for key in columns],
                   [(it.row.id, [cell(k, row) for k in columns])
                    for it, row in zip(message.items, flat, strict=True)])
        tasks = {it.row.task for it in message.items}
        acc = self.query_one("#compare-acc", OverlayPlot)
        if tasks == {"lm"}:
            acc.title, acc.ylim = "Validation loss (nats/token)", None
        self.query_one("#compare-loss", OverlayPlot).set_series(
            {label(it): it.loss_curve for it in message.items})
        self.query_one("#compare-acc", OverlayPlot).set_series(
            {label(it): [(e, a if it.row.task == "lm" else 100 * a) for e, a in it.acc_curve]
             for it in message.items})
        notes = [message.error] if message.error else summary_lines(list(message.items))
        self.query_one("#compare-notes", Static).update("\n".join(notes))
        self.show_waterfalls(message.items)
        self.loaded = True

    def show_waterfalls(self, items: tuple[CompareRow, ...]) -> None:
        """Each run's scaling waterfall (``gputui.runs.compare.waterfall``), where it has one."""
        text = []
        for it in items:
            if it.waterfall is not None:
                title = (f"{label(it)} against {it.baseline.rsplit('-', 1)[-1]}: scaling "
                         f"waterfall, speedup x")
                text += waterfall.lines(it.waterfall, width=30, title=title)
        self.query_one("#compare-waterfall-text", Static).update("\n".join(text))
        self.query_one("#compare-waterfall").display = bool(text)

    def action_reload(self) -> None:
        """Read the records again (a run may have finished meanwhile)."""
        self.load()
