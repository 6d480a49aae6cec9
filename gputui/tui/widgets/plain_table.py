"""A DataTable whose text cells are shown as they are, never as Rich markup.

DataTable reads a ``str`` cell as markup, so a run named ``[/bold]q`` raised MarkupError and a
folder named ``[b]x`` lost its brackets. Every table that shows text from a record, a file or
the user is a PlainTable: ``str`` cells become :class:`rich.text.Text` on the way in.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellType, ColumnKey, RowKey


def plain(value: Any) -> Any:
    """``value`` as a cell shown literally: a str becomes Text; anything else is kept."""
    return Text(value, end="") if isinstance(value, str) else value


class PlainTable(DataTable):
    """DataTable with literal text cells (see the module's docstring)."""

    def add_row(self, *cells: CellType, height: int | None = 1, key: str | None = None,
                label: Any = None) -> RowKey:
        return super().add_row(*(plain(c) for c in cells), height=height, key=key,
                               label=plain(label))

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType,
                    *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, plain(value), update_width=update_width)
