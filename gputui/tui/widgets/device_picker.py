"""The set-up screen's device table: pick GPUs by row, or a number of CPU virtual devices."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Click
from textual.message import Message
from textual.widgets import DataTable, Label, Select, Static

from gputui.core.devices import Device, DeviceSpecError, requested_count, resolve_spec, wants_gpus
from gputui.core.events import plural
from gputui.tui.inventory import (MAX_CPU_DEVICES, DeviceRow, Inventory, gpu_indices,
                                  links_note)

COLUMNS = ("use", "device", "name", "memory", "util", "status")
CPU_ROW_NOTE = ("A CPU row cannot be toggled on its own: CPU virtual devices are used together. "
                "Choose how many under the table (CPU virtual devices), or pick a GPU row.")


class DeviceTable(DataTable):
    """A DataTable where one click toggles a row (DataTable's own first click only moves the
    cursor there, and a second click selects)."""

    def on_click(self, event: Click) -> None:
        row = event.style.meta.get("row", -1)
        if isinstance(row, int) and row >= 0 and row != self.cursor_row:
            # DataTable's handler (after this one) moves the cursor; select once it has.
            self.call_later(self.action_select_cursor)


class DevicePicker(Vertical):
    """Selectable device rows (Enter, Space or a click toggles a GPU) and a CPU count.

    With no GPU selected the run uses the chosen number of CPU virtual devices, which is also
    all there is on a machine without GPUs; the sentence under the table says why.
    """

    BINDINGS = [Binding("space", "toggle_device", "Toggle device")]

    class Changed(Message):
        """The device choice changed; ``spec`` is what ``devices.spec`` will say."""

        def __init__(self, spec: str) -> None:
            super().__init__()
            self.spec = spec

    def __init__(self, inventory: Inventory | None = None, spec: str = "cpu*2",
                 fallback: str = "none") -> None:
        super().__init__(id="devices")
        self.border_title = "Devices"
        self.inventory = inventory or Inventory()
        self.selected_gpus: set[int] = set()
        self.cpu_count = 2
        self._row_keys: tuple[str, ...] = ()
        # A preset's GPU choice, kept until the user picks devices by hand: applied when
        # discovery has answered, and again whenever the machine's GPUs change.
        self.wanted: tuple[str, str] | None = None
        self.spec_note = self._apply_spec(spec, fallback)

    @property
    def waiting(self) -> bool:
        """True while a GPU choice waits for the first discovery."""
        return self.wanted is not None and not self.inventory.discovered

    def compose(self) -> ComposeResult:
        yield DeviceTable(id="device-table", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="cpu-count-row"):
            yield Label("CPU virtual devices ", id="cpu-count-label")
            options = [(str(i), i) for i in range(1, max(MAX_CPU_DEVICES, self.cpu_count) + 1)]
            yield Select(options, value=self.cpu_count, allow_blank=False, id="cpu-count",
                         compact=True)
        yield Static("", id="no-gpu-note")
        yield Static("", id="link-note")

    def on_mount(self) -> None:
        table = self.query_one("#device-table", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self._fill()

    # ------------------------------------------------------------------ state
    @property
    def spec(self) -> str:
        """The devices.spec for the current choice: 'cuda:1', '0,2', 'cpu' or 'cpu*4' (the
        preset's own while it waits for discovery)."""
        if self.waiting and self.wanted is not None:  # waiting: a wanted spec, undiscovered
            return self.wanted[0]
        if self.selected_gpus:
            idx = sorted(self.selected_gpus)
            return f"cuda:{idx[0]}" if len(idx) == 1 else ",".join(map(str, idx))
        return "cpu" if self.cpu_count == 1 else f"cpu*{self.cpu_count}"

    def devices(self) -> list[Device]:
        """The chosen devices, without asking the hardware again ([] while waiting)."""
        if self.waiting:
            return []
        if self.selected_gpus:
            return [r.device() for r in self.inventory.gpus if r.index in self.selected_gpus]
        return [r.device() for r in self.inventory.cpu_rows(self.cpu_count)]

    def _apply_spec(self, spec: str, fallback: str = "none") -> str:
        """Select what ``spec`` names; returns a sentence when it had to fall back to CPU."""
        self.selected_gpus = set()
        self.wanted = (spec, fallback) if wants_gpus(spec) else None
        if not wants_gpus(spec):
            self.cpu_count = max(1, requested_count(spec))
            return ""
        if not self.inventory.discovered:
            return ""  # applied by set_inventory when the GPUs are known
        try:
            chosen, note = resolve_spec(spec, fallback, list(self.inventory.gpu_infos),
                                        self.inventory.no_gpu_reason)
        except DeviceSpecError as exc:
            self.cpu_count = max(1, min(MAX_CPU_DEVICES, requested_count(spec)))
            return f"{exc}; showing {plural(self.cpu_count, 'CPU virtual device')} instead"
        self.selected_gpus = {d.index for d in chosen if d.kind == "cuda"}
        if not self.selected_gpus:
            self.cpu_count = len(chosen)
        return note

    def set_spec(self, spec: str, fallback: str = "none") -> str:
        """Show a preset's device choice; returns a note when it cannot be met here."""
        note = self._apply_spec(spec, fallback)
        if self.is_mounted:
            self._sync_select()
            self._fill()
        return note

    def set_inventory(self, inventory: Inventory) -> str:
        """Show fresh readings; rows that vanished lose their selection. A preset's GPU
        choice is applied when the first discovery arrives and again when the GPUs change;
        returns the note when it cannot be met (else "")."""
        before = self.inventory
        self.inventory = inventory
        note = ""
        if self.wanted is not None and (not before.discovered
                                        or gpu_indices(before) != gpu_indices(inventory)):
            note = self._apply_spec(*self.wanted)
            if self.is_mounted:
                self._sync_select()
        else:
            self.selected_gpus &= {r.index for r in inventory.gpus}
        if self.is_mounted:
            self._fill()
        return note

    def _sync_select(self) -> None:
        select = self.query_one("#cpu-count", Select)
        with select.prevent(Select.Changed):
            if self.cpu_count > MAX_CPU_DEVICES:
                select.set_options([(str(i), i) for i in range(1, self.cpu_count + 1)])
            select.value = self.cpu_count

    # ------------------------------------------------------------------ drawing
    def _rows(self) -> list[tuple[DeviceRow, bool]]:
        use_cpu = not self.selected_gpus and not self.waiting
        rows = [(r, r.index in self.selected_gpus) for r in self.inventory.gpus]
        rows += [(r, use_cpu) for r in self.inventory.cpu_rows(self.cpu_count)]
        return rows

    def _fill(self) -> None:
        table = self.query_one("#device-table", DataTable)
        rows = self._rows()
        keys = tuple(r.name for r, _ in rows)
        if keys != self._row_keys:
            cursor = table.cursor_row
            table.clear()
            for r, on in rows:
                table.add_row(*self._cells(r, on), key=r.name)
            table.move_cursor(row=min(cursor, len(rows) - 1))
            self._row_keys = keys
        else:
            for r, on in rows:
                for col, value in zip(COLUMNS, self._cells(r, on), strict=True):
                    table.update_cell(r.name, col, value, update_width=True)
        self.query_one("#no-gpu-note", Static).update(self.inventory.gpu_note())
        note = links_note(self.selected_gpus, self.inventory.links) if not self.waiting else ""
        self.query_one("#link-note", Static).update(note)
        self.set_class(bool(note), "-links")
        self.set_class(not self.inventory.gpus, "-no-gpu")

    @staticmethod
    def _cells(r: DeviceRow, on: bool) -> tuple[str, ...]:
        return ("✔" if on else "·", r.name, r.label, r.memory, r.util, r.status)

    # ------------------------------------------------------------------ input
    def action_toggle_device(self) -> None:
        """Space toggles the row under the cursor, as Enter does."""
        self.query_one("#device-table", DataTable).action_select_cursor()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter or a click on a row: toggle a GPU, or switch back to CPU devices."""
        event.stop()
        key = str(event.row_key.value)
        kind, _, index = key.partition(":")
        self.wanted = None  # the user's own choice from now on
        if kind == "cuda":
            self.selected_gpus ^= {int(index)}
        elif not self.selected_gpus:  # already on CPU: nothing a row could toggle
            self.notify(CPU_ROW_NOTE, title="CPU virtual devices", timeout=6)
            return
        else:
            self.selected_gpus = set()
        self._fill()
        self.post_message(self.Changed(self.spec))

    def on_select_changed(self, event: Select.Changed) -> None:
        """A new number of CPU virtual devices (it also switches from GPUs to CPU)."""
        event.stop()
        if isinstance(event.value, int) and (event.value != self.cpu_count
                                             or self.selected_gpus):
            self.cpu_count = event.value
            self.selected_gpus = set()
            self.wanted = None
            self._fill()
            self.post_message(self.Changed(self.spec))
