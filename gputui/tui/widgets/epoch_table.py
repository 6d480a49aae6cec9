"""One row per finished epoch: time beside test accuracy, as the material reports them (a
language model's validation loss and perplexity instead)."""

from __future__ import annotations

from textual.widgets import DataTable

from gputui.core.events import EpochEnd, acc_text
from gputui.core.scores import score_cell
from gputui.tui.fmt import fmt_rate


class EpochTable(DataTable):
    """Epoch, test accuracy, train time, train loss, eval time, samples/s: the score and the
    time first (the material's pair), so a narrow table (30 columns at 80x24) cuts the least
    read columns and never the time."""

    COLUMNS = ("epoch", "test acc", "time", "loss", "eval", "samples/s")

    def __init__(self) -> None:
        super().__init__(id="epoch-table", cursor_type="row", zebra_stripes=True)
        self.rows_by_epoch: dict[int, EpochEnd] = {}

    def on_mount(self) -> None:
        for name in self.COLUMNS:
            self.add_column(name, key=name)
        self.labels = self.COLUMNS

    def language_model(self) -> None:
        """Relabel for a language model (before its first epoch): its score is the validation
        loss and perplexity, its speed tokens/s."""
        self.clear(columns=True)
        self.labels = ("epoch", "val loss (ppl)", "time", "loss", "eval", "tokens/s")
        for name, label in zip(self.COLUMNS, self.labels, strict=True):
            self.add_column(label, key=name)

    def add_epoch(self, ev: EpochEnd) -> None:
        """Add (or replace, for a repeated epoch number) the row of one epoch."""
        score = (score_cell("lm", None, ev.val_loss) if ev.task == "lm"
                 else acc_text(ev.test_acc))
        cells = (f"{ev.epoch}/{ev.epochs}", score, f"{ev.seconds:.1f} s", f"{ev.train_loss:.4f}",
                 f"{ev.eval_s:.1f} s",
                 fmt_rate(ev.tokens_per_s if ev.task == "lm" and ev.tokens_per_s
                          else ev.samples_per_s))
        key = str(ev.epoch)
        if ev.epoch in self.rows_by_epoch:
            for name, value in zip(self.COLUMNS, cells, strict=True):
                self.update_cell(key, name, value)
        else:
            self.add_row(*cells, key=key)
            self.move_cursor(row=self.row_count - 1)
        self.rows_by_epoch[ev.epoch] = ev
