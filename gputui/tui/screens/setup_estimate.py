"""The set-up screen's estimate before Start: how long the run will take, from this
machine's earlier runs of the same work, else from the prediction's kept measurements, else
why there is none (:mod:`gputui.tui.estimate`).

Both sources are read off the UI thread: the history once the screen is painted (and again
when it is shown again), the prediction's cache whenever the config's work changes; until
an answer is in, the ready line says nothing of the time.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.message import Message

from gputui.core.config import RunConfig
from gputui.tui.estimate import HOW_TO_MEASURE, Estimate, estimate, predicted, same_work
from gputui.tui.messages import HistoryRead


class EstimatePredicted(Message):
    """The prediction's answer for the config ``key`` names: an Estimate, or why none."""

    def __init__(self, key: str, answer: Estimate | str) -> None:
        super().__init__()
        self.key, self.answer = key, answer


class SetupEstimate:
    """Mixed into SetupScreen (which provides ``runs_dir`` and ``revalidate``)."""

    runs_dir: Path | None
    history: tuple = ()
    history_read = False  # the history's rows are in (or there is none to read)
    painted = False  # the screen has been painted whole (SetupScreen._painted)
    _predict_asked: str | None = None  # the key of the config last sent to the prediction
    _predict_answer: tuple[str, Estimate | str] | None = None
    time_hint = ""  # the ready line's tooltip, when it says the time is unknown

    # ------------------------------------------------------------------ the history
    @work(thread=True, exclusive=True, group="history", exit_on_error=False)
    def read_history(self) -> None:
        """Read the earlier runs off the UI thread (the estimate before Start rests on
        them)."""
        from gputui.runs.history import load_rows

        try:
            rows = tuple(load_rows(self.runs_dir)) if self.runs_dir is not None else ()
        except OSError:
            rows = ()  # no history: the prediction, or why there is no estimate
        self.post_message(HistoryRead(rows))  # type: ignore[attr-defined]

    def on_history_read(self, message: HistoryRead) -> None:
        self.history, self.history_read = message.rows, True
        self.revalidate()  # type: ignore[attr-defined]

    def on_screen_resume(self) -> None:
        """Back from a run or another screen: the history may hold a new run (the first time
        the screen shows, it is read once the screen is painted: SetupScreen._painted)."""
        if self.painted:
            self.call_after_refresh(self.read_history)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ the prediction
    def time_text(self, cfg: RunConfig, n: int, gpu: str) -> str:
        """What the ready line says of the run's time: ' · about 4 min …', ' · time
        unknown: …', or '' (a run under a minute, or no answer yet). ``gpu``: the chosen
        GPUs' name from the last discovery ('' on CPU devices)."""
        text = self._time_text(cfg, n, gpu)
        # the tooltip says how a first run gets one
        self.time_hint = HOW_TO_MEASURE if text.startswith(" · time unknown") else ""
        return text

    def _time_text(self, cfg: RunConfig, n: int, gpu: str) -> str:
        expected = estimate(cfg, self.history, n)
        if expected is not None:
            return f" · {expected.text()}"
        if not self.history_read or any(same_work(r, cfg, n) for r in self.history):
            return ""  # the history first (read after the first paint); or done in a minute
        key = repr((cfg, n, gpu))
        if self._predict_answer is not None and self._predict_answer[0] == key:
            answer = self._predict_answer[1]
            if isinstance(answer, str):
                return f" · time unknown: {answer}"
            return f" · {answer.text()}" if answer.seconds > 60 else ""
        if key != self._predict_asked:
            self._predict_asked = key
            self.predict_time(cfg, n, gpu, key)
        return ""

    @property
    def estimate_settled(self) -> bool:
        """The history is read and the prediction has answered for the config last shown
        (what a test or a snapshot waits for)."""
        return self.history_read and (self._predict_asked is None or (
            self._predict_answer is not None
            and self._predict_answer[0] == self._predict_asked))

    @work(thread=True, exclusive=True, group="estimate", exit_on_error=False)
    def predict_time(self, cfg: RunConfig, n: int, gpu: str, key: str) -> None:
        """Ask the prediction's kept measurements off the UI thread (a file read; the GPUs
        are the last discovery's, NVML is not asked)."""
        try:
            answer: Estimate | str = predicted(cfg, n, gpu)
        except Exception as exc:  # noqa: BLE001 - an estimate is a courtesy, never an error
            answer = f"the prediction's kept measurements could not be read ({exc})"
        self.post_message(EstimatePredicted(key, answer))  # type: ignore[attr-defined]

    def on_estimate_predicted(self, message: EstimatePredicted) -> None:
        """The prediction's answer; one for a config since changed is dropped."""
        if message.key == self._predict_asked:
            self._predict_answer = (message.key, message.answer)
            self.revalidate()  # type: ignore[attr-defined]
