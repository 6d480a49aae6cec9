"""The plan screen (F8): will the set-up's GPT fit, and how fast, on GPUs this machine does not
have; the app's face of `gputui plan` (``gputui.runs.forecast``, the same planner).

The user names the devices as `--gpus` does (8xH100, 2x8xH100, cpu*2), the nodes, a vocabulary
and a profile file of their own; ctrl+r plans in a thread worker (the meshes are traced in the
planner's own spawned child, or answered from its kept traces) while the planner's progress
lines show under the form and each mesh's row joins the table as soon as it is traced (the rows
so far, in order; a row is written or loaded once the plan is whole). Then: the table (the
meshes that fit first, most tokens/s first, the reason beside each that does not), the memory
per rank of the row under the cursor, part by part, and the memory-against-speed view with its
Pareto front. ctrl+s writes the row as a preset (`gputui plan --write-preset`'s text); ctrl+e
loads it into the set-up form, to run. Escape goes back, and stops a plan in flight with its
tracing child.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, Static
from textual.worker import get_current_worker

from gputui.core.config import ConfigError, RunConfig
from gputui.core.events import plural
from gputui.runs.forecast.cells import COLUMNS, origin, row_cells, seconds
from gputui.tui.fmt import bar_text, fmt_bytes
from gputui.tui.messages import UsePlannedRow
from gputui.tui.widgets.pareto_plot import ParetoPlot, Point
from gputui.tui.widgets.plain_table import PlainTable
from gputui.tui.widgets.too_small import TooSmall

if TYPE_CHECKING:
    from gputui.runs.forecast.estimate import Row
    from gputui.runs.forecast.planner import Plan

GIB = 2**30
TRACER = "gputui-plan-trace"  # the planner's child processes (runs.forecast.tracing)
TABLE_COLUMNS = [*COLUMNS, ("why it does not fit", "reason")]
# the memory parts of a row, as the breakdown names them
PARTS = [("params", "parameters (sharded)"), ("gathered", "parameters gathered"),
         ("grads", "gradients"), ("optim", "optimizer state"),
         ("activations", "activations"), ("temps", "temporaries"),
         ("buffers", "comm buffers")]


class PlanProgress(Message):
    """One of the planner's progress lines (what `gputui plan` prints on stderr)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class PlanReady(Message):
    """The plan, handed over whole by the worker (which keeps no reference to it)."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan


def is_tracer(name: str) -> bool:
    """Whether a child process is one of the planner's tracing children."""
    from gputui.core.proctree import child_of

    return child_of(name, TRACER)


class PlanRow(Message):
    """A mesh's row as soon as it is traced (before the plan is whole), with the memory a
    rank of the cluster can use and whether its collectives are measured after the last
    mesh (this machine's CPU ranks: ``links.will_measure``)."""

    def __init__(self, row: Row, usable: int, measured_after: bool) -> None:
        super().__init__()
        self.row, self.usable, self.measured_after = row, usable, measured_after


class PlanFailed(Message):
    """The plan could not be made: one line naming what is wrong and the fix."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class PlanStopped(Exception):
    """The screen was left (or the app quit) while the worker planned."""


@dataclass(frozen=True)
class Target:
    """What to plan for, as the form gives it."""

    gpus: str
    nodes: int
    vocab: int | None
    profile: str | None


def read_target(gpus: str, nodes: str, vocab: str, profile: str) -> Target:
    """The form's fields as a target; ConfigError naming the field and the fix."""
    gpus = gpus.strip()
    if not gpus:
        raise ConfigError("GPUs: name the devices, e.g. 8xH100, 2x8xH100, H200 or cpu*2")

    def count(name: str, text: str, default: int | None) -> int | None:
        text = text.strip().replace(",", "").replace("_", "")
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{name} {text!r}: give a whole number, 1 or more") from None
        if value < 1:
            raise ConfigError(f"{name} {value}: give a whole number, 1 or more")
        return value

    profile_path = profile.strip()
    if profile_path and not Path(profile_path).expanduser().is_file():
        raise ConfigError(f"profile {profile_path}: no such file (a TOML file of device "
                          f"profiles, devices.toml's layout; leave it empty for the listed "
                          f"devices)")
    return Target(gpus, count("nodes", nodes, 1) or 1, count("vocab", vocab, None),
                  str(Path(profile_path).expanduser()) if profile_path else None)


def in_app_terms(text: str) -> str:
    """The planner's sentences name `gputui plan`'s flags; here they are the form's fields."""
    return (text.replace("given with --profile", "named in the profile field")
            .replace("--gpus", "GPUs").replace("--profile", "profile")
            .replace("--nodes", "nodes").replace("--vocab", "vocab"))


def breakdown(row: Row, number: str, usable: int) -> str:
    """The memory per rank of ``row`` part by part (with a bar of its share of the peak), its
    step time and collectives, and why it does not fit."""
    s = row.shape
    levers = f", {s.levers()}" if s.levers() else ""
    head = f"row {number}: {row.strategy}, {s.describe()}{levers}"
    if not row.peak:
        return f"{head}\nnot planned: {row.reason}"
    verdict = "fits" if row.fits else "does not fit"
    lines = [head, f"peak {fmt_bytes(row.peak)} per rank, {verdict} in {fmt_bytes(usable)} "
                   f"usable", ""]
    width = max(len(label) for _, label in PARTS)
    for key, label in PARTS:
        value = row.mem.get(key, 0)
        share = value / row.peak if row.peak else 0.0
        extra = ""
        if key == "activations" and row.per_block_act:
            extra = f"  ({fmt_bytes(row.per_block_act)} a block)"
        lines.append(f"{label:<{width}} {fmt_bytes(value):>10} {bar_text(share, 12)}{extra}")
    lines.append("")
    if row.step_s:
        lines.append(f"step {seconds(row.step_s)}: compute {seconds(row.compute_s)} + comm "
                     f"waited for {seconds(row.comm_exposed_s)}")
        mfu = f", MFU {row.mfu:.0%}" if row.mfu else ""
        lines.append(f"{row.tokens_per_s or 0:,.0f} tokens/s (global batch {row.batch}, "
                     f"micro-batch {row.micro_batch}){mfu}")
    for c in row.comm:
        mark = origin(c)
        lines.append(f"  {c['kind']} {c['phase']}, group {c['group']}: "
                     f"{plural(int(c['count']), 'call')}, {fmt_bytes(int(c['bytes']))}, "
                     f"{seconds(c['seconds'])}{mark}")
    if row.reason:
        lines += ["", f"does not fit: {row.reason}"]
    for f in row.formula:
        lines.append(f"formula: {f}")
    return "\n".join(lines)


class PlanScreen(Screen):
    """Plan the set-up's model on devices named here; the rows, the fit, the front."""

    # The app's stylesheet belongs to the app; these rules travel with the screen.
    DEFAULT_CSS = """
    #plan-form { height: 3; }
    #plan-form Label { padding: 1 0 0 1; }
    #plan-gpus { width: 16; }
    #plan-nodes, #plan-vocab { width: 9; }
    #plan-profile { width: 1fr; }
    #plan-status { height: auto; max-height: 4; padding: 0 1; }
    #plan-status.-error { color: $error; }
    #plan-table { height: 1fr; min-height: 4; }
    #plan-bottom { height: 2fr; min-height: 10; }
    #plan-detail { width: 1fr; padding: 0 1; }
    #plan-pareto { width: 1fr; }
    PlanScreen.-w-small #plan-pareto { width: 30; }
    PlanScreen.-h-small #plan-bottom { min-height: 8; }
    """
    BINDINGS = [
        Binding("ctrl+r", "plan", "Plan", priority=True),
        Binding("ctrl+s", "write_preset", "Row as preset", priority=True),
        Binding("ctrl+e", "use_row", "Row into set-up", priority=True),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, config: RunConfig, *, child_output: Path | None = None,
                 runs_dir: Path | None = None, screen_id: str = "plan") -> None:
        super().__init__(id=screen_id)
        self.config = config
        self.runs_dir = runs_dir  # where a kept run of the model gives the plan its efficiency
        self.child_output = child_output  # where the tracing child's stray output goes
        self.planning = False
        self.plan: Plan | None = None
        self.rows: dict[str, Row] = {}  # by table key: '1'.. (planned), 'x1'.. (not planned)
        self.so_far: list[Row] = []  # the rows of the plan in flight, as they are traced
        self.measured_after = False  # a row so far whose collectives are measured at the end
        self.fill_due = False  # the rows so far wait for the next refresh to be shown
        self.progress = ""  # the planner's last progress line
        self.usable = 0  # the bytes a rank of the planned cluster can use

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="plan-form"):
            yield Label("GPUs")
            yield Input("8xH100", id="plan-gpus")
            yield Label("nodes")
            yield Input("1", id="plan-nodes")
            yield Label("vocab")
            yield Input("", placeholder="256", id="plan-vocab")
            yield Label("profile")
            yield Input("", placeholder="devices.toml", id="plan-profile")
            yield Button("Plan", id="plan-start", variant="primary")
        yield Static("", id="plan-status", markup=False)
        yield PlainTable(id="plan-table", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="plan-bottom"):
            with VerticalScroll(id="plan-detail"):
                yield Static("", id="plan-row", markup=False)
                yield Static("", id="plan-notes", markup=False)
            yield ParetoPlot(id="plan-pareto")
        yield Footer()
        yield TooSmall()

    def on_mount(self) -> None:
        self.sub_title = f"plan · {self.config.run.name}"
        self._status(self._intro())

    def _intro(self) -> str:
        from gputui.runs.forecast.planner import model_of
        from gputui.runs.forecast.profiles import load_profiles

        cfg = self.config
        try:
            model = model_of(cfg, None, None, None)
        except ConfigError as exc:
            return f"✗ {in_app_terms(str(exc))}: load a GPT preset in the set-up first"
        known = ", ".join(load_profiles())
        return (f"Plans {cfg.run.name}: a {model.params() / 1e6:,.1f}M-parameter GPT "
                f"(n_layer {model.n_layer}, n_embd {model.n_embd}, context {model.context}, "
                f"{model.precision}, batch {model.batch}) for every mesh of the devices. "
                f"GPUs: COUNTxDEVICE or NODESxCOUNTxDEVICE ({known}) or cpu*N. ctrl+r plans.")

    def _status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#plan-status", Static)
        status.update(text)
        status.set_class(error, "-error")

    # ------------------------------------------------------------------ planning
    def action_plan(self) -> None:
        """Plan for the devices the form names (a plan in flight: say so)."""
        if self.planning:
            self.notify("A plan is being made: wait for it, or Escape to stop it",
                        severity="warning")
            return
        try:
            target = read_target(*(self.query_one(f"#plan-{k}", Input).value
                                   for k in ("gpus", "nodes", "vocab", "profile")))
        except ConfigError as exc:
            self._status(f"✗ {exc}", error=True)
            return
        from gputui.tui.spawnsafe import ready_for_spawn

        ready_for_spawn(self.child_output)  # the tracer's stray output stays off the screen
        self.planning = True
        self.so_far, self.measured_after, self.progress = [], False, ""
        self.plan = None  # the rows shown are this plan's, not a row to write, until it ends
        self._fill([])  # nothing of an earlier plan stays beside this one's rows
        self.query_one("#plan-row", Static).update("")
        self.query_one("#plan-notes", Static).update("")
        self.query_one("#plan-start", Button).disabled = True
        self._status(f"planning for {target.gpus}"
                     f"{f' on {target.nodes} nodes' if target.nodes > 1 else ''} …")
        self._plan(target)

    @work(thread=True, exclusive=True, group="plan", exit_on_error=False)
    def _plan(self, target: Target) -> None:
        """The planner, off the UI thread: its progress lines come here as messages."""
        from gputui.runs.forecast.links import will_measure
        from gputui.runs.forecast.planner import KeptRuns, cluster_of, make_plan, model_of

        worker = get_current_worker()

        def line(text: str) -> None:
            # the planner calls this before it spawns and as the child reports: a screen
            # left meanwhile ends the plan here (the tracer's loop kills its child)
            if worker.is_cancelled:
                raise PlanStopped
            self.post_message(PlanProgress(text.strip()))

        try:
            model = model_of(self.config, target.vocab, None, None)
            cluster = cluster_of(target.gpus, target.nodes, target.profile, line, None,
                                 KeptRuns(model, self.runs_dir, self.config.run.compile))
            line(f"planning {self.config.run.name} ({model.params() / 1e6:,.1f}M parameters) "
                 f"on {cluster.describe()}")
            usable = cluster.profile.usable()

            def row(r: Row) -> None:
                if not worker.is_cancelled:
                    self.post_message(PlanRow(r, usable, will_measure(r, cluster)))

            plan = make_plan(model, cluster, line, on_row=row)
        except PlanStopped:
            return
        except (ConfigError, LookupError) as exc:
            self.post_message(PlanFailed(in_app_terms(str(exc))))
            return
        except Exception as exc:  # noqa: BLE001 - the tracer failed: say so in the screen
            # one line: a child's error can come indented over several
            said = " ".join(str(exc).split()) or type(exc).__name__
            self.post_message(PlanFailed(f"the plan failed: {said}"))
            return
        if not worker.is_cancelled:
            self.post_message(PlanReady(plan))

    def on_plan_progress(self, message: PlanProgress) -> None:
        if self.planning:
            self.progress = message.text
            self._status(self._in_flight())

    def _in_flight(self) -> str:
        """The planner's last progress line, and the rows so far."""
        if not self.so_far:
            return self.progress
        n = len(self.so_far)
        later = ("; on these CPU ranks their collectives are measured after the last mesh, "
                 "so the steps so far are the formula's" if self.measured_after else "")
        return f"{self.progress}\n{n} mesh{'es' if n != 1 else ''} traced so far{later}"

    def on_plan_row(self, message: PlanRow) -> None:
        """A mesh traced: the rows so far, in the plan's order, and their front."""
        if not self.planning:
            return
        self.so_far.append(message.row)
        self.usable = message.usable
        self.measured_after |= message.measured_after
        self._status(self._in_flight())
        if not self.fill_due:  # a burst of rows (kept ones come at once): one fill
            self.fill_due = True
            self.call_after_refresh(self._fill_so_far)

    def _fill_so_far(self) -> None:
        """The rows so far in order, the cursor kept on the row it was on."""
        self.fill_due = False
        if not self.planning:
            return
        from gputui.runs.forecast.estimate import order

        table = self.query_one(PlainTable)
        held = None
        if table.row_count:
            held = self.rows.get(str(table.coordinate_to_cell_key(
                table.cursor_coordinate).row_key.value))
        self._fill(order(self.so_far))
        key = next((k for k, r in self.rows.items() if r is held), None)
        if key is not None:
            table.move_cursor(row=table.get_row_index(key))
            # its number may have changed (a faster mesh came before it): the pane says so
            # too, not only the table (a highlight is not told when the index stays)
            self._show_row(key)

    def on_plan_failed(self, message: PlanFailed) -> None:
        self._done()
        self._status(f"✗ {message.error}", error=True)

    def on_plan_ready(self, message: PlanReady) -> None:
        """Fill the table, the notes and the view; the first row under the cursor."""
        self._done()
        plan = self.plan = message.plan
        self.usable = usable = plan.cluster.profile.usable()
        self._fill(plan.rows)
        planned = [r for r in plan.rows if r.peak]
        table = self.query_one(PlainTable)
        fit = sum(1 for r in planned if r.fits)
        meshes = f"{len(planned)} mesh" + ("es" if len(planned) != 1 else "")
        self._status(f"{plan.cluster.describe()}: {meshes} planned, {fit} fit"
                     f"{'s' if fit == 1 else ''} ({fmt_bytes(usable)} usable per rank); "
                     f"* the Pareto front. ctrl+s writes the row as a preset, ctrl+e loads "
                     f"it into the set-up.")
        notes = ["assumptions:", *(f"  {a}" for a in plan.assumptions)]
        skipped = [r for r in plan.rows if not r.peak]
        if skipped:
            notes.append("not planned:")
            notes += [f"  {r.shape.describe()}: {r.reason}" for r in skipped]
        self.query_one("#plan-notes", Static).update("\n" + "\n".join(notes))
        if table.row_count:
            table.move_cursor(row=0)
            self._show_row(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
            table.focus()

    def _fill(self, rows: list[Row]) -> None:
        """The table and the memory-against-speed view of ``rows`` (in order): numbered
        rows first, the front starred, then those not planned."""
        from gputui.runs.forecast.estimate import pareto

        front = {id(r) for r in pareto(rows)}
        self.rows = {str(i): r for i, r in enumerate((r for r in rows if r.peak), 1)}
        self.rows.update({f"x{i}": r for i, r in enumerate((r for r in rows if not r.peak), 1)})
        cells = []
        for key, r in self.rows.items():
            number = key if r.peak else ""
            c = row_cells(r, number + ("*" if id(r) in front else ""))
            c["reason"] = r.reason if not r.fits else ""
            cells.append((key, [c[k] for _, k in TABLE_COLUMNS]))
        self.query_one(PlainTable).fill(TABLE_COLUMNS, cells)
        self.query_one(ParetoPlot).show(tuple(
            Point(key, r.peak / GIB, r.tokens_per_s or 0.0, r.fits, id(r) in front)
            for key, r in self.rows.items() if r.peak and r.tokens_per_s), self.usable / GIB)

    def _done(self) -> None:
        self.planning = False
        self.query_one("#plan-start", Button).disabled = False

    @on(DataTable.RowHighlighted, "#plan-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_row(event.row_key.value)

    def _show_row(self, key: str | None) -> None:
        row = self.rows.get(key or "")
        if row is None or not self.usable:
            return
        self.query_one("#plan-row", Static).update(
            breakdown(row, str(key) if row.peak else "-", self.usable))
        self.query_one(ParetoPlot).select(key)

    def selected(self) -> tuple[str, Row] | None:
        """The planned row under the cursor ('#', row), or None (saying why)."""
        table = self.query_one(PlainTable)
        if self.plan is None or not table.row_count:
            self.notify("No plan yet: ctrl+r plans", severity="warning")
            return None
        key = str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        row = self.rows.get(key)
        if row is None or not row.peak:
            self.notify("This mesh was not planned: choose a numbered row", severity="warning")
            return None
        return key, row

    def _preset_text(self, row: Row) -> str:
        from gputui.runs.forecast.planner import preset_text

        assert self.plan is not None
        return preset_text(self.config.run.name, self.config, row, self.plan.cluster)

    # ------------------------------------------------------------------ into a run
    def action_write_preset(self) -> None:
        """Write the row under the cursor as a preset (`gputui plan --write-preset`'s text)."""
        chosen = self.selected()
        if chosen is None:
            return
        number, row = chosen
        from gputui.tui.screens.dialogs import save_preset

        def saved(path: Path, name: str) -> None:
            self.notify(f"Row {number} ({row.shape.describe()}) written as a preset: {path}; "
                        f"run it with `gputui run {name}` on the planned devices", timeout=10)

        save_preset(self, f"{self.config.run.name}-plan-{number}", self._preset_text(row), saved)

    def action_use_row(self) -> None:
        """Load the row under the cursor into the set-up form (the app goes back to it)."""
        chosen = self.selected()
        if chosen is None:
            return
        import tomllib

        from gputui.core.config import from_dict

        number, row = chosen
        cfg = from_dict(tomllib.loads(self._preset_text(row)), f"plan row {number}")
        self.post_message(UsePlannedRow(cfg, f"{self.config.run.name} · plan row {number} "
                                             f"({row.shape.describe()})"))

    # ------------------------------------------------------------------ leaving
    def action_back(self) -> None:
        """Back to the screen below; a plan in flight is stopped."""
        self.stop_planning()
        self.app.pop_screen()

    def stop_planning(self) -> None:
        """Cancel the worker and end its tracing child now (the worker's next progress line
        would end it too, but a mesh can take a while to trace)."""
        if not self.planning:
            return
        self.workers.cancel_group(self, "plan")
        self.planning = False
        from gputui.core.proctree import kill_tree

        for child in multiprocessing.active_children():
            if is_tracer(child.name) and child.pid is not None:
                kill_tree(child.pid)

    def on_unmount(self) -> None:
        self.stop_planning()
