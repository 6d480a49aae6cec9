"""The plan's memory-against-speed view in the app: every planned mesh as peak memory per rank
against tokens/s, the Pareto front joined, the device's usable memory as a line, the row
under the table's cursor marked (the PNG of `gputui plan --png`, drawn with plotext)."""

from __future__ import annotations

from dataclasses import dataclass


from gputui.tui.widgets.plots import RedrawnPlot, draw_empty


@dataclass(frozen=True)
class Point:
    """One planned mesh: its '#' in the table, peak GiB per rank, tokens/s, whether it fits
    and whether it is on the front."""

    number: str
    peak_gib: float
    tokens_per_s: float
    fits: bool
    front: bool


class ParetoPlot(RedrawnPlot):
    """Peak GiB per rank (x) against tokens/s (y); redrawn when the points or the cursor
    change."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="metric-plot")
        self.points: tuple[Point, ...] = ()
        self.usable_gib: float | None = None
        self.selected: str | None = None  # the '#' of the row under the table's cursor
        self.empty = "no plan yet: ctrl+r plans"

    def show(self, points: tuple[Point, ...], usable_gib: float | None,
             empty: str = "no mesh has figures") -> None:
        """The plan's points (none: ``empty`` says why) and the usable memory."""
        self.points, self.usable_gib, self.empty = points, usable_gib, empty
        self.redraw()

    def select(self, number: str | None) -> None:
        """Mark the row under the table's cursor."""
        if number != self.selected:
            self.selected = number
            self.redraw()

    @property
    def front(self) -> list[Point]:
        """The Pareto front, smallest peak first (as drawn)."""
        return sorted((p for p in self.points if p.front), key=lambda p: p.peak_gib)

    def redraw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("memory against speed (* Pareto front)")
        plt.xlabel("peak GiB per rank")
        if not self.points:
            draw_empty(plt, self.empty)
            self.refresh()
            return
        top = max(p.tokens_per_s for p in self.points)
        scale, unit = next(((s, u) for s, u in ((1e9, "G"), (1e6, "M"), (1e3, "k"))
                            if top >= s), (1.0, ""))

        def y(points: list[Point]) -> list[float]:
            return [p.tokens_per_s / scale for p in points]

        for fits, marker, color, label in ((True, "dot", "blue", "fits"),
                                           (False, "x", "gray", "does not fit")):
            pts = [p for p in self.points if p.fits == fits and not p.front]
            if pts:
                plt.scatter([p.peak_gib for p in pts], y(pts),
                            marker=marker, color=color, label=label)
        front = self.front
        if front:
            plt.plot([p.peak_gib for p in front], y(front),
                     marker="*", color="red", label="Pareto front")
        chosen = [p for p in self.points if p.number == self.selected]
        if chosen:
            plt.scatter([chosen[0].peak_gib], y(chosen), marker="O",
                        color="green", label=f"row {chosen[0].number}")
        if self.usable_gib is not None and self.usable_gib <= 2 * max(
                p.peak_gib for p in self.points):
            # the usable memory, where it is near enough to the points to read beside them
            plt.vline(self.usable_gib, "gray")
        plt.ylabel(f"{unit} tokens/s".strip())
        self.refresh()
