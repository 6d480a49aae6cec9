"""`compare --plots`: curves.png plots test accuracy in percent, as every table and screen
shows it (it plotted the fraction, 0.685-0.710, beside tables saying 68.50%)."""

from __future__ import annotations

import pytest

from gputui.runs.compare import export
from gputui.runs.compare.table import compare
from run_records import write_record


def test_curves_plot_accuracy_in_percent(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    run = write_record(tmp_path / "runs", "20260101-100000-exp-aaaa", acc=0.7, epochs=2)
    figures = []
    monkeypatch.setattr(export, "_save", lambda fig, plt, path: figures.append(fig) or path)
    export.plot_curves(compare([run], tmp_path / "runs"), tmp_path / "curves.png")
    (_, ax_acc) = figures[0].axes
    (line,) = ax_acc.lines
    assert list(line.get_ydata()) == pytest.approx([70.0, 70.0])
    assert ax_acc.get_ylabel() == "test accuracy (%)"
