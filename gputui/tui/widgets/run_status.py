"""The run screen's status strip: state, epoch progress with an ETA, init time, throughput.

Times come from the events themselves (their ``t`` and ``step_time_s``), not from a clock in
the UI, so a replayed event stream always shows the same numbers.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, ProgressBar, Static

from gputui.core.config_schema import lr_scheduled
from gputui.core.events import EpochEnd, InitDone, RunStarted, StepMetrics
from gputui.tui.fmt import eta_seconds, fmt_duration, fmt_rate

STATE_TEXT = {
    "starting": "◌ starting", "running": "● running", "stopping": "◍ stopping",
    "finished": "✔ finished", "stopped": "■ stopped", "killed": "✘ killed",
    "failed": "✘ failed",
}


class RunStatus(Vertical):
    """Holds the run's progress numbers and shows them; fed by the run screen."""

    def __init__(self, run_id: str = "") -> None:
        super().__init__(id="run-status")
        self.run_id = run_id
        self.headline = ""
        self.epochs = 0
        self.epoch = 0
        self.steps_per_epoch = 0
        self.step = 0
        self.global_step = 0
        self.step_time: float | None = None
        self.samples_per_s: float | None = None
        self.tokens_per_s: float | None = None  # a language model's
        self.init_s: float | None = None
        self.eval_s = 0.0
        self.t0: float | None = None
        self.t_last: float | None = None
        self.finished_epochs = 0
        self.show_lr = False  # the run's lr is scheduled: the meta line shows it
        self.lr: float | None = None  # the last logged step's

    def compose(self) -> ComposeResult:
        with Horizontal(id="status-top"):
            yield Label(STATE_TEXT["starting"], id="state-badge")
            yield Static(self.run_id, id="status-headline", markup=False)
        with Horizontal(id="status-progress"):
            yield Label("epoch -/- · step -/-", id="epoch-label")
            yield ProgressBar(total=None, show_eta=False, id="epoch-progress")
            yield Label("ETA --:--", id="eta-label")
        yield Static("init n/a · samples/s n/a · elapsed --:--", id="status-meta")
        yield Static("", id="record-line", markup=False)

    # ------------------------------------------------------------------ feeding
    def set_state(self, state: str) -> None:
        """Show the run's state (the screen also flips its CSS class)."""
        self.query_one("#state-badge", Label).update(STATE_TEXT.get(state, state))

    def started(self, ev: RunStarted) -> None:
        """The run began: its id, epochs and devices."""
        self.t0 = self.t_last = ev.t
        self.run_id = ev.run_id
        self.epochs = ev.config.run.epochs
        self.show_lr = lr_scheduled(ev.config.optim)
        names = ", ".join(d.get("name", "?") for d in ev.devices if isinstance(d, dict))
        self.headline = (f"{ev.run_id} · strategy {ev.strategy} · {len(ev.devices)} device"
                         f"{'s' if len(ev.devices) != 1 else ''} ({names})")
        self.query_one("#status-headline", Static).update(self.headline)

    def init_done(self, ev: InitDone) -> None:
        """Set-up finished: init time and steps per epoch."""
        self.init_s = ev.seconds
        if ev.steps_per_epoch:
            self.steps_per_epoch = ev.steps_per_epoch

    def step_metrics(self, ev: StepMetrics) -> None:
        """Progress and throughput at a logged step."""
        self.epoch, self.step, self.global_step = ev.epoch, ev.step, ev.global_step
        self.steps_per_epoch = ev.steps_per_epoch or self.steps_per_epoch
        self.samples_per_s = ev.samples_per_s
        self.tokens_per_s = ev.tokens_per_s
        self.lr = ev.lr
        # A short moving average: steady ETA, yet it follows a slowdown within a few logs.
        self.step_time = (ev.step_time_s if self.step_time is None
                          else 0.7 * self.step_time + 0.3 * ev.step_time_s)
        self.t_last = ev.t

    def epoch_end(self, ev: EpochEnd) -> None:
        """An epoch finished (its evaluation time feeds the ETA)."""
        self.epochs = ev.epochs or self.epochs
        self.finished_epochs = ev.epoch
        self.epoch = ev.epoch
        self.step = self.steps_per_epoch
        self.eval_s = ev.eval_s
        self.t_last = ev.t

    def touch(self, t: float) -> None:
        """Any event moves 'elapsed' forward."""
        if self.t0 is None:
            self.t0 = t
        self.t_last = max(self.t_last or t, t)

    def set_record(self, text: str) -> None:
        """Show where the run record is and what it says."""
        self.query_one("#record-line", Static).update(text)

    # ------------------------------------------------------------------ showing
    def eta(self, ended: bool = False, finished: bool = False) -> float | None:
        """Seconds left: remaining steps at the recent step time, plus evaluations; none
        for a run that ended before its last epoch (stopped, killed, failed)."""
        if ended:
            return 0.0 if finished else None
        evals_left = max(0, self.epochs - self.finished_epochs)
        return eta_seconds(self.done_steps, self.total_steps, self.step_time, evals_left,
                           self.eval_s)

    @property
    def total_steps(self) -> int:
        """The whole run's optimizer steps (0 until the steps per epoch are known)."""
        return self.steps_per_epoch * self.epochs

    @property
    def done_steps(self) -> int:
        """Steps done in the whole run: the bar, the step count and the ETA all mean these,
        as the headless printer's progress does."""
        return self.steps_per_epoch * max(0, self.epoch - 1) + self.step

    def progress_text(self) -> str:
        """'epoch 2/3 · step 92/138': the epoch as text, the steps of the whole run."""
        total = self.total_steps
        steps = f"{self.done_steps}/{total}" if total else f"{self.done_steps}/?"
        return f"epoch {self.epoch or '-'}/{self.epochs or '?'} · step {steps}"

    def redraw(self, ended: bool = False, finished: bool = False) -> None:
        """Refresh the progress line and the meta line from the numbers held."""
        self.query_one("#epoch-label", Label).update(self.progress_text())
        bar = self.query_one("#epoch-progress", ProgressBar)
        if self.total_steps:
            bar.update(total=self.total_steps, progress=self.done_steps)
        self.query_one("#eta-label", Label).update(
            f"ETA {fmt_duration(self.eta(ended, finished))} (whole run)")
        init = f"{self.init_s:.1f} s" if self.init_s is not None else "n/a"
        elapsed = (self.t_last - self.t0) if self.t0 is not None and self.t_last else None
        lr = f" · lr {self.lr:.3g}" if self.show_lr and self.lr is not None else ""
        self.query_one("#status-meta", Static).update(
            f"init {init} · samples/s {fmt_rate(self.samples_per_s)} · "
            + (f"tokens/s {fmt_rate(self.tokens_per_s)} · " if self.tokens_per_s else "") +
            f"step {self.global_step}{lr} · elapsed {fmt_duration(elapsed)}")
