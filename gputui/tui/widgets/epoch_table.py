"""One row per finished epoch: time beside test accuracy, as the material reports them."""

from __future__ import annotations

from textual.widgets import DataTable

from gputui.core.events import EpochEnd, acc_text
from gputui.tui.fmt import fmt_rate


class EpochTable(DataTable):
    """Epoch, train time, eval time, train loss, test accuracy, samples/s."""

    COLUMNS = ("epoch", "time", "eval", "loss", "test acc", "samples/s")

    def __init__(self) -> None:
        super().__init__(id="epoch-table", cursor_type="row", zebra_stripes=True)
        self.rows_by_epoch: dict[int, EpochEnd] = {}

    def on_mount(self) -> None:
        for name in self.COLUMNS:
            self.add_column(name, key=name)

    def add_epoch(self, ev: EpochEnd) -> None:
        """Add (or replace, for a repeated epoch number) the row of one epoch."""
        cells = (f"{ev.epoch}/{ev.epochs}", f"{ev.seconds:.1f} s", f"{ev.eval_s:.1f} s",
                 f"{ev.train_loss:.4f}", acc_text(ev.test_acc), fmt_rate(ev.samples_per_s))
        key = str(ev.epoch)
        if ev.epoch in self.rows_by_epoch:
            for name, value in zip(self.COLUMNS, cells, strict=True):
                self.update_cell(key, name, value)
        else:
            self.add_row(*cells, key=key)
            self.move_cursor(row=self.row_count - 1)
        self.rows_by_epoch[ev.epoch] = ev
