"""The run history screen: every recorded run in a table; open one, or mark several and
compare them.

Records are read in a thread worker (a runs folder can hold many runs, some damaged); the
handler only fills the table. Enter opens the run under the cursor with its plots (a run
still running: live on the run screen, read-only, from its record), space
marks runs, c compares the marked runs (or the one under the cursor), r reloads.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from gputui.core.events import plural
from gputui.core.scores import score_cell
from gputui.runs.compare.cells import fmt
from gputui.runs.history import RunRow, load_rows
from gputui.tui.messages import OpenCompare, WatchRun
from gputui.tui.widgets.plain_table import PlainTable
from gputui.tui.widgets.too_small import TooSmall

# the columns read first come first, so a narrow terminal cuts the others
COLUMNS = [("", "mark"), ("id", "id"), ("strategy", "strategy"), ("devices", "devices"),
           # one column, each cell naming its score: accuracy, or a language model's loss
           ("test acc / val loss", "score"), ("status", "status"),
           ("samples/s", "samples_per_s"), ("time/epoch", "time_per_epoch_s"),
           ("name", "name"), ("batch", "batch"), ("lr", "lr"), ("tokens/s", "tokens_per_s"),
           ("date", "date")]


class HistoryLoaded(Message):
    """The rows read from the runs folder (a tuple: a frozen snapshot for the UI thread)."""

    def __init__(self, rows: tuple[RunRow, ...], error: str = "") -> None:
        super().__init__()
        self.rows, self.error = rows, error


class HistoryScreen(Screen):
    """Past runs, newest first."""

    # The app's stylesheet belongs to the app; these few rules travel with the screen.
    DEFAULT_CSS = """
    #history-note { height: auto; padding: 0 1; color: $text-muted; }
    #history-table { height: 1fr; }
    """
    BINDINGS = [
        Binding("enter", "open_run", "Open"),
        Binding("space", "toggle_mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("r", "reload", "Reload"),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, runs_dir: str | Path, *, screen_id: str = "history") -> None:
        super().__init__(id=screen_id)
        self.runs_dir = Path(runs_dir)
        self.rows: dict[str, RunRow] = {}
        self.marked: list[str] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"Runs in {self.runs_dir}: loading…", id="history-note", markup=False)
        yield PlainTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Footer()
        yield TooSmall()

    def on_mount(self) -> None:
        self.sub_title = "run history"
        table = self.query_one(DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        self.load()

    @work(thread=True, exclusive=True, group="history", exit_on_error=False)
    def load(self) -> None:
        """Read every record off the UI thread."""
        try:
            self.post_message(HistoryLoaded(tuple(load_rows(self.runs_dir))))
        except OSError as exc:
            self.post_message(HistoryLoaded((), f"cannot read {self.runs_dir}: {exc}"))

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        """Fill the table (marks survive a reload)."""
        self.rows = {r.id: r for r in message.rows}
        self.marked = [m for m in self.marked if m in self.rows]
        self.query_one(PlainTable).fill(COLUMNS, [(r.id, self._cells(r)) for r in message.rows],
                                        at_least={"mark": 1})
        note = self.query_one("#history-note", Static)
        if message.error:
            note.update(message.error)
        elif not message.rows:
            note.update(f"No runs recorded in {self.runs_dir} yet.")
        else:
            text = (f"{plural(len(message.rows), 'run')} in {self.runs_dir}. "
                    f"Enter opens a run, space marks runs, c compares the marked ones.")
            damaged = [r for r in message.rows if r.problem]
            if damaged:  # as `gputui runs` says it: which record, and what in it does not read
                more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
                text += (f"\n{plural(len(damaged), 'record')} read only in part: "
                         f"{damaged[0].id}: {damaged[0].problem}{more}")
            note.update(text)
        self.loaded = True

    def _cells(self, row: RunRow) -> list[str]:
        mark = "●" if row.id in self.marked else ""
        values = row.to_dict()
        values["score"] = score_cell(row.task, row.test_acc, row.val_loss)
        return [mark] + [fmt(key, values.get(key)) for _, key in COLUMNS[1:]]

    def cursor_run(self) -> RunRow | None:
        """The run under the cursor, if any."""
        table = self.query_one(DataTable)
        if not self.rows or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return self.rows.get(str(key.value))

    def action_toggle_mark(self) -> None:
        """Mark or unmark the run under the cursor for comparison."""
        row = self.cursor_run()
        if row is None:
            return
        if row.id in self.marked:
            self.marked.remove(row.id)
        else:
            self.marked.append(row.id)
        self.query_one(DataTable).update_cell(row.id, "mark", "●" if row.id in self.marked
                                              else "")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter (or a click) on a row opens that run."""
        self.action_open_run()

    def action_open_run(self) -> None:
        """The run under the cursor, with its plots; a run still running (started
        elsewhere: another terminal, a SLURM job, another node) opens live on the run screen,
        followed from its record."""
        row = self.cursor_run()
        if row is None:
            return
        if row.status == "running":
            self.post_message(WatchRun(self.runs_dir / row.id))
        else:
            self.open_compare([row.id], title=f"run {row.id}")

    def action_compare(self) -> None:
        """Compare the marked runs (or the one under the cursor)."""
        ids = list(self.marked)
        if not ids and (row := self.cursor_run()) is not None:
            ids = [row.id]
        if ids:
            self.open_compare(ids, title=f"comparing {len(ids)} runs")

    def open_compare(self, ids: list[str], title: str) -> None:
        """Ask the app for the compare screen of these runs."""
        self.post_message(OpenCompare([self.runs_dir / i for i in ids], self.runs_dir,
                                      title=title))

    def action_reload(self) -> None:
        """Read the runs folder again."""
        self.load()
