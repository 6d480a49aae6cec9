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
from gputui.runs.verify_trace import TOLERANCES, Difference, Trace, compare, explain, read_trace
from gputui.core import registry, signals
from gputui.plan import why_not
from gputui.runs.history import row_for
from gputui.runs import warm
from gputui.runs.launcher import launch
from gputui.runs.prepare import override_checked

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
    # beyond the tolerance, but the arithmetic alone explains it (verify_trace.explain): why
    rounding: str = ""
    # beyond the tolerance and not explained: what the control run could not show ("")
    no_control: str = ""

    @property
    def passed(self) -> bool:
        return self.difference is not None and self.difference.passed

    @property
    def result(self) -> str:
        """'pass', 'rounding' (beyond the tolerance; the arithmetic alone explains it) or
        'fail'."""
        return "pass" if self.passed else "rounding" if self.rounding else "fail"

    def to_dict(self) -> dict[str, Any]:
        d = self.difference
        return {"strategy": self.strategy, "devices": self.devices, "run_id": self.run_id,
                "passed": self.passed, "result": self.result,
                "rounding": self.rounding or None, "error": self.error,
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
    control_run: str = ""  # single summing in another order (only when one was needed)
    bound: float = 0.0  # the most rounding can move an element by (rounding_bound)
    # the control run's trace, or why there is none (None: not run yet)
    control: Trace | str | None = field(default=None, repr=False)
    outcomes: list[Outcome] = field(default_factory=list)
    interrupted: int = 0  # the stop signal that ended verify early (0: none came)
    interrupted_at: str = ""  # the strategy whose run it stopped ("" between two runs)

    @property
    def passed(self) -> bool:
        """No strategy failed (a difference the arithmetic explains is no failure)."""
        return all(o.result != "fail" for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "rtol": self.rtol, "atol": self.atol,
                "steps": self.steps, "single_run": self.single_run, "passed": self.passed,
                "control_run": self.control_run or None, "rounding_bound": self.bound,
                "strategies": [o.to_dict() for o in self.outcomes],
                "interrupted": self.interrupted or None,
                "interrupted_at": self.interrupted_at or None}


def single_spec(device: Device) -> str:
    """The device spec of ``single`` on ``device``."""
    return "cpu" if device.kind == "cpu" else str(device.index)


def strategies_for(cfg: RunConfig, devices: list[Device], named: list[str] | None) -> list[str]:
    """The strategies to verify: ``named`` (ConfigError, one line, for one that cannot run on
    ``devices``), or every strategy but single that can (``plan.why_not``)."""
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


def _changes(cfg: RunConfig, strategy: str, spec: str, steps: int,
             extra: dict[str, Any] | None = None) -> list[tuple[str, str, Any]]:
    """What a verify run changes in the preset's config."""
    batch = cfg.optim.batch_size
    changes: dict[str, Any] = {
        "strategy.name": strategy, "devices.spec": spec, "devices.fallback": "none",
        "optim.scale_with_devices": False, "run.epochs": 1, "run.checkpoint": False,
        "run.resume_from": "", "run.name": f"verify-{strategy}", "telemetry.enabled": False,
        "debug.trace_steps": steps, **(extra or {})}
    if not cfg.data.factory:  # the built-in data: load no more than the steps take
        changes["data.train_size"] = max(steps, cfg.optim.warmup_steps + 1) * batch
        changes["data.test_size"] = min(batch, 256)
    return [("verify", k, v) for k, v in changes.items()]


def _run(cfg: RunConfig, strategy: str, spec: str, steps: int, runs_dir: Path | None,
         line: Line, extra: dict[str, Any] | None = None,
         what: str = "") -> tuple[str, Path | None, str]:
    """Launch one traced run and wait for it; (run id, its folder, why it failed or "")."""
    ready = override_checked(cfg, _changes(cfg, strategy, spec, steps, extra))
    line(f"verify: {what or strategy} on {spec}, {steps} steps ...")
    warm.ready_for(strategy, ready.devices)  # verify's one-process runs share one host
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


def rounding_bound(cfg: RunConfig, steps: int) -> float:
    """The most ``steps`` steps of ``cfg``'s optimizer can move an element apart in two runs
    whose gradients differ only by rounding (0.0: no more than the tolerance allows).

    Adam divides each gradient by its own running RMS: an element whose true gradient is
    (near) zero, as the key bias of an attention whose softmax ignores it, gets a gradient of
    rounding noise, which Adam scales up to a full step, in a direction rounding picks. One
    step of Adam moves an element by at most lr x max(1, (1 - beta1) / sqrt(1 - beta2))
    (Kingma and Ba, section 2.1); two runs can step in opposite directions: twice that, each
    step, at the peak lr. SGD passes rounding through at its own small size: 0.0."""
    import math

    if cfg.optim.name not in ("adam", "adamw"):
        return 0.0
    b1, b2 = cfg.optim.betas
    return 2 * cfg.optim.lr * steps * max(1.0, (1 - b1) / math.sqrt(1 - b2))


def single_extra(cfg: RunConfig) -> dict[str, Any] | None:
    """What single's reference run changes besides the strategy: no expert parallelism (its
    one process holds every expert; parallel.ep is the other strategies')"""
    return {"parallel.ep": 1} if cfg.parallel.ep > 1 else None


def control_changes(cfg: RunConfig) -> dict[str, Any] | None:
    """The change that makes single sum each batch in another order and nothing else (twice
    its micro-batches), or None when its batch cannot be split so."""
    micro = cfg.optim.micro_batches * 2
    if cfg.optim.batch_size % micro:
        return None
    return {"optim.micro_batches": micro, "run.name": "verify-single-reordered",
            **(single_extra(cfg) or {})}


def verify(cfg: RunConfig, devices: list[Device], strategies: list[str], steps: int,
           runs_dir: str | Path | None = None, line: Line = lambda s: None) -> Report:
    """Run single and each strategy for ``steps`` steps from the same start; compare.
    Raises RuntimeError (one line) when single's own run fails."""
    rtol, atol = tolerance(cfg, steps)
    report = Report(cfg.run.precision, rtol, atol, steps, bound=rounding_bound(cfg, steps))
    where = Path(runs_dir) if runs_dir else None
    # The stop contract: a stop signal stops the run in flight (its record kept, "stopped"),
    # starts no other, and the report ends there: what was compared, and where it stopped.
    try:
        report.single_run, ref_dir, error = _run(cfg, "single", single_spec(devices[0]),
                                                 steps, where, line, single_extra(cfg))
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
                got = read_trace(run_dir)
                outcome.difference = compare(ref, got, rtol, atol)
                if not outcome.passed and report.bound > 0:
                    control = _control(cfg, devices, steps, where, line, report, ref)
                    if isinstance(control, str):
                        outcome.no_control = control
                    else:
                        outcome.rounding = explain(ref, got, control, rtol, atol,
                                                   report.bound) or ""
            except ValueError as exc:
                outcome.error = str(exc)
        report.outcomes.append(outcome)
        line(f"verify: {name}: {verdict(outcome)}")
    return report


def _control(cfg: RunConfig, devices: list[Device], steps: int, where: Path | None,
             line: Line, report: Report, ref: Trace) -> Trace | str:
    """Single's trace when it sums each batch in another order (run once, when a strategy
    first breaks the tolerance), or why there is none."""
    if report.control is not None:
        return report.control
    extra = control_changes(cfg)
    if extra is None:
        out: Trace | str = (f"optim.batch_size {cfg.optim.batch_size} cannot be split into "
                            f"{cfg.optim.micro_batches * 2} micro-batches for the control run")
    else:
        run_id, run_dir, error = _run(cfg, "single", single_spec(devices[0]), steps, where,
                                      line, extra, "single summing in another order")
        report.control_run = run_id
        out = read_trace(run_dir) if run_dir is not None else f"the control run {error}"
    report.control = out
    return out


def verdict(o: Outcome) -> str:
    """One outcome in words: pass, or where it failed."""
    d = o.difference
    if d is None:
        return f"FAIL ({o.error})"
    if d.passed:
        return "pass"
    if o.rounding:
        return f"ROUNDING (no fault found): {o.rounding}"
    what = "the loss" if d.first_what == "loss" else f"parameter {d.first_what}"
    return f"FAIL: first diverged at step {d.first_step}, {what}"
