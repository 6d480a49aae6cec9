"""``gputui verify``: does each strategy still train the same model as ``single``?

Every strategy runs as ``gputui run`` runs it (the launcher, the run host, its ranks through
torch elastic), from the preset's config: the same seed, so the same initial parameters, the
same global batch (``optim.scale_with_devices`` off) and the same batches, for a few steps
(``debug.trace_steps``: the run keeps each step's loss and parameters, gathered whole, in its
folder, and ends after them). ``single`` runs on the first of the devices. Each strategy's
trace is then compared with single's (:mod:`gputui.runs.verify_trace`): the largest parameter
and loss differences, pass or fail against float32's tolerance (or the precision's), and the
first step and parameter that broke it. The runs stay in the runs folder as records, named
``verify-<strategy>``. Torch-free: the training happens in the spawned hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gputui.core.config import ConfigError, RunConfig, apply_overrides
from gputui.core.devices import Device
from gputui.runs.verify_trace import TOLERANCES, Difference, compare, read_trace

DEFAULT_STEPS = 5
ADAM_SLACK = 1e-3  # of the lr per step, added to atol under adam/adamw (see verify)
Line = Callable[[str], None]


@dataclass
class Outcome:
    """One strategy's verdict against single (``difference`` None when its run failed)."""

    strategy: str
    devices: str
    run_id: str
    difference: Difference | None = None
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.difference is not None and self.difference.passed

    def to_dict(self) -> dict[str, Any]:
        d = self.difference
        return {"strategy": self.strategy, "devices": self.devices, "run_id": self.run_id,
                "passed": self.passed, "error": self.error,
                "max_param_diff": d.max_param_diff if d else None,
                "max_param": d.max_param_name if d else None,
                "max_loss_diff": d.max_loss_diff if d else None,
                "first_step": d.first_step if d else None,
                "first_diverged": d.first_what if d else None,
                "steps": d.steps if d else None}


@dataclass
class Report:
    """Every strategy's outcome, and what they were measured against."""

    precision: str
    rtol: float
    atol: float
    steps: int
    single_run: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    interrupted: int = 0  # the stop signal that ended verify early (0: none came)
    interrupted_at: str = ""  # the strategy whose run it stopped ("" between two runs)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "rtol": self.rtol, "atol": self.atol,
                "steps": self.steps, "single_run": self.single_run, "passed": self.passed,
                "strategies": [o.to_dict() for o in self.outcomes],
                "interrupted": self.interrupted or None,
                "interrupted_at": self.interrupted_at or None}


def single_spec(device: Device) -> str:
    """The device spec of ``single`` on ``device``."""
    return "cpu" if device.kind == "cpu" else str(device.index)


def strategies_for(cfg: RunConfig, devices: list[Device], named: list[str] | None) -> list[str]:
    """The strategies to verify: ``named`` (ConfigError, one line, for one that cannot run on
    ``devices``), or every strategy but single that can (``plan.why_not``)."""
    from gputui.core import registry
    from gputui.plan import why_not

    out = []
    for name in named if named else [n for n in registry.names() if n != "single"]:
        if registry.get(name) is None:
            raise ConfigError(f"--strategies: {name!r} is not a strategy; choose from "
                              f"{', '.join(registry.names())}")
        reason = why_not(apply_overrides(cfg, [("--strategies", "strategy.name", name)]),
                         devices)
        if reason is None:
            out.append(name)
        elif named:
            raise ConfigError(f"--strategies: {name} cannot run here: {reason}")
    if not out:
        raise ConfigError("no strategy but single can run on these devices; choose more "
                          "devices with --devices")
    return out


def _changes(cfg: RunConfig, strategy: str, spec: str, steps: int) -> list[tuple[str, str, Any]]:
    """What a verify run changes in the preset's config."""
    batch = cfg.optim.batch_size
    changes: dict[str, Any] = {
        "strategy.name": strategy, "devices.spec": spec, "devices.fallback": "none",
        "optim.scale_with_devices": False, "run.epochs": 1, "run.checkpoint": False,
        "run.resume_from": "", "run.name": f"verify-{strategy}", "telemetry.enabled": False,
        "debug.trace_steps": steps}
    if not cfg.data.factory:  # the built-in data: load no more than the steps take
        changes["data.train_size"] = max(steps, cfg.optim.warmup_steps + 1) * batch
        changes["data.test_size"] = min(batch, 256)
    return [("verify", k, v) for k, v in changes.items()]


def _run(cfg: RunConfig, strategy: str, spec: str, steps: int, runs_dir: Path | None,
         line: Line) -> tuple[str, Path | None, str]:
    """Launch one traced run and wait for it; (run id, its folder, why it failed or "")."""
    from gputui.runs.history import row_for
    from gputui.runs.launcher import launch
    from gputui.runs.prepare import override_checked

    ready = override_checked(cfg, _changes(cfg, strategy, spec, steps))
    line(f"verify: {strategy} on {spec}, {steps} steps ...")
    handle = launch(ready.config, runs_dir, ready.devices, ready.note)
    try:
        while not handle.done:
            handle.poll(timeout=0.2)
    except BaseException:
        handle.kill("verify interrupted")
        raise
    row = row_for(handle.run_dir)
    if row.status != "finished":
        return handle.run_id, None, f"its run {row.id} ended {row.status}" + (
            f": {row.reason}" if row.reason else "")
    return handle.run_id, Path(handle.run_dir), ""


def tolerance(cfg: RunConfig, steps: int) -> tuple[float, float]:
    """(rtol, atol) for ``steps`` steps of ``cfg``: the precision's, widened for Adam."""
    rtol, atol = TOLERANCES.get(cfg.run.precision, TOLERANCES["fp32"])
    if cfg.optim.name in ("adam", "adamw"):
        # Adam divides each gradient by its own RMS, so a rounding difference of a reordered
        # sum (shards, stages, chunks) moves an element with a near-zero gradient by up to
        # its lr: the float32 rule alone fails sound strategies (the equivalence tests use a
        # small lr for this). A fault is a relative change of the update, far above this.
        atol += ADAM_SLACK * cfg.optim.lr * steps
    return rtol, atol


def verify(cfg: RunConfig, devices: list[Device], strategies: list[str], steps: int,
           runs_dir: str | Path | None = None, line: Line = lambda s: None) -> Report:
    """Run single and each strategy for ``steps`` steps from the same start; compare.
    Raises RuntimeError (one line) when single's own run fails."""
    from gputui.core import signals

    rtol, atol = tolerance(cfg, steps)
    report = Report(cfg.run.precision, rtol, atol, steps)
    where = Path(runs_dir) if runs_dir else None
    # The stop contract: a stop signal stops the run in flight (its record kept, "stopped"),
    # starts no other, and the report ends there: what was compared, and where it stopped.
    try:
        report.single_run, ref_dir, error = _run(cfg, "single", single_spec(devices[0]),
                                                 steps, where, line)
    except signals.Interrupted as exc:
        report.interrupted = exc.signum
        return report
    if signals.stopped():
        report.interrupted, report.interrupted_at = signals.stopped() or 0, "single"
        return report
    if ref_dir is None:
        raise RuntimeError(f"single's reference run failed: {error}")
    ref = read_trace(ref_dir)
    spec = cfg.devices.spec
    for name in strategies:
        try:
            run_id, run_dir, error = _run(cfg, name, spec, steps, where, line)
        except signals.Interrupted as exc:
            report.interrupted = exc.signum
            break
        if signals.stopped():  # its run was stopped: no verdict on it
            report.interrupted, report.interrupted_at = signals.stopped() or 0, name
            break
        outcome = Outcome(name, spec, run_id, error=error)
        if run_dir is not None:
            try:
                outcome.difference = compare(ref, read_trace(run_dir), rtol, atol)
            except ValueError as exc:
                outcome.error = str(exc)
        report.outcomes.append(outcome)
        line(f"verify: {name}: {verdict(outcome)}")
    return report


def verdict(o: Outcome) -> str:
    """One outcome in words: pass, or where it failed."""
    d = o.difference
    if d is None:
        return f"FAIL ({o.error})"
    if d.passed:
        return "pass"
    what = "the loss" if d.first_what == "loss" else f"parameter {d.first_what}"
    return f"FAIL: first diverged at step {d.first_step}, {what}"
