"""A DataTable whose text cells are shown as they are, never as Rich markup.

DataTable reads a ``str`` cell as markup, so a run named ``[/bold]q`` raised MarkupError and a
folder named ``[b]x`` lost its brackets. Every table that shows text from a record, a file or
the user is a PlainTable: ``str`` cells become :class:`rich.text.Text` on the way in.

``fill`` replaces a table's columns and rows with each column as wide as its widest cell,
given up front: DataTable measures its cells only when its message queue is next idle, and
the rows it drew before that keep the empty table's column widths until something redraws
them (its measure clears no cache), so on a busy machine a history or a comparison showed cut
columns (and one snapshot in three caught them).
"""

from __future__ import annotations

from typing import Any, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellType, ColumnKey, RowKey


def plain(value: Any) -> Any:
    """``value`` as a cell shown literally: a str becomes Text; anything else is kept."""
    return Text(value, end="") if isinstance(value, str) else value


def width_of(cell: Any) -> int:
    """The cells a value takes on one line (its widest line)."""
    if isinstance(cell, Text):
        return max((line.cell_len for line in cell.split(allow_blank=True)), default=0)
    return max((cell_len(line) for line in str(cell).splitlines()), default=0)


class PlainTable(DataTable):
    """DataTable with literal text cells and up-front column widths (see the module's
    docstring)."""

    def fill(self, columns: Sequence[tuple[str, str]],
             rows: Sequence[tuple[str, Sequence[Any]]],
             at_least: dict[str, int] | None = None) -> None:
        """Replace the columns ((label, key), in order) and the rows ((key, cells)), each
        column as wide as its label and its widest cell (or ``at_least[key]``)."""
        self.clear(columns=True)
        cells = [[plain(c) for c in row] for _, row in rows]
        for i, (label, key) in enumerate(columns):
            width = max([cell_len(label), (at_least or {}).get(key, 0)]
                        + [width_of(row[i]) for row in cells if i < len(row)])
            self.add_column(label, key=key, width=width)
        for (key, _), row in zip(rows, cells, strict=True):
            super().add_row(*row, key=key)

    def add_row(self, *cells: CellType, height: int | None = 1, key: str | None = None,
                label: Any = None) -> RowKey:
        return super().add_row(*(plain(c) for c in cells), height=height, key=key,
                               label=plain(label))

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType,
                    *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, plain(value), update_width=update_width)
