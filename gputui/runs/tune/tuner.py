"""``gputui tune``'s engine: rank the candidate configurations by the prediction, measuring
what it needs within the time budget, then confirm the best few by short real runs.

The prediction's inputs are :class:`gputui.runs.predict.measure.Measurer`'s (kept per machine,
measured when missing), and each setting's factor is a one-device ``single`` run with that
setting alone (:mod:`gputui.runs.tune.space`). The confirming runs are the points of a sweep
(:class:`gputui.runs.sweep.runner.Sweep`: ``prepare`` and the launcher, a record each, the sweep's
signal handling), capped at a few steps; the sweep's gate skips a point whose estimated
length would end after the budget, and every later one. What they measured is read back
through :func:`gputui.runs.compare.table.compare` (steady state, noise, contention, compare's
baseline rules); :mod:`gputui.runs.tune.result` turns it into the table and the choice.
Torch-free.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gputui.core.config import ConfigError, RunConfig, apply_overrides, effective_batch_size
from gputui.runs.tune.space import MEM_SHARE, Candidate, Ranked, order, rank
from gputui.core import registry
from gputui.core.config_schema import PRECISIONS
from gputui.core.devices import DeviceSpecError
from gputui.runs.predict.cache import Cache, compute_key, cores
from gputui.runs.predict.inputs import stale
from gputui.runs.predict.measure import Measurer
from gputui.runs.predict.scaling import predict, STRATEGIES
from gputui.runs.sweep.runner import Point, spec_for, Sweep
from gputui.runs.tune.space import axis_changes
from gputui import plan
from gputui.runs.predict.measure import MEASURE_STEPS

CONV_MODELS = ("lenet", "resnet18")  # channels_last changes nothing for the others
START_GUESS_S = 5.0  # a confirming run's start-up and evaluation until one has been timed


@dataclass
class Axes:
    """The values ``tune`` tries on each axis (None: its default)."""

    strategies: list[str] | None = None
    micro_batches: list[int] | None = None
    precisions: list[str] | None = None
    compile: list[str] | None = None
    channels_last: list[bool] | None = None
    batch_per_device: list[int] | None = None


@dataclass
class Tuner:
    """One ``tune`` invocation; ``line`` receives the progress lines."""

    preset: str  # the preset file's path
    sets: list[str]  # --set assignments, as typed (the sweep keeps them)
    overrides: list  # the same, parsed
    base: RunConfig  # the preset with them
    n: int
    kind: str  # "cpu" | "gpu"
    runs_dir: Path  # where the confirming runs are recorded
    measure_dir: Path  # where the prediction's measuring runs are recorded
    budget_s: float
    top: int = 3
    steps: int = 40
    line: Callable[[str], None] = print
    start: float = field(default_factory=time.monotonic)
    skipped: list = field(default_factory=list)  # (label, why it cannot run)
    ranked: list = field(default_factory=list)  # list[Ranked], fastest first
    budget_notes: list = field(default_factory=list)
    sweep: Any = None
    _wall: dict = field(default_factory=dict)  # point key -> (started, candidate)
    _start_s: float = 0.0  # the longest start-up + evaluation seen in a confirming run
    _over: bool = False
    _admitted: int = 0  # confirming runs the gate let start
    _t_1: float = 0.0  # the one-device step at the preset's batch, once known

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    # -- the candidates --------------------------------------------------------------------

    def specs(self) -> tuple[str, str]:
        """The devices.spec of N devices and of one."""
        return spec_for(str(self.n), self.kind), spec_for("1", self.kind)

    def global_batch(self) -> int:
        return effective_batch_size(self.base, self.n)

    def preset_candidate(self) -> Candidate:
        """The preset's own settings (what every factor is measured against)."""
        r = self.base.run
        return Candidate(self.base.strategy.name, self.specs()[0], self.n, self.global_batch(),
                         self.base.optim.micro_batches, r.precision, r.compile, r.channels_last)

    def candidates(self, axes: Axes) -> list[Candidate]:
        """Every combination of the axes that can run here; the rest go to ``skipped``."""
        from gputui.hw.discovery import resolve_with_gpus

        b, r = self.preset_candidate(), self.base.run
        spec_n, spec_1 = self.specs()
        devices = {}
        for spec in {spec_n, spec_1}:
            try:
                devices[spec] = resolve_with_gpus(spec, "none")[0]
            except DeviceSpecError as exc:
                raise ConfigError(f"--devices {self.n}: {exc}") from None
        model = self.base.model
        conv = model.name in CONV_MODELS and not model.factory
        strategies = axes.strategies or [s for s in ("single", *STRATEGIES) if registry.get(s)]
        micro = axes.micro_batches or sorted({1, 2, 4, b.micro_batches})
        precisions = axes.precisions or [p for p in PRECISIONS
                                         if p != "fp16" or self.kind == "gpu"]
        compiles = axes.compile or list(dict.fromkeys(["off", "default", r.compile]))
        cl = axes.channels_last or ([False, True] if conv else [r.channels_last])
        per_dev = axes.batch_per_device or list(dict.fromkeys(
            [max(1, b.batch // self.n), 2 * max(1, b.batch // self.n)]))
        out = []
        for s in strategies:
            spec = spec_1 if s == "single" else spec_n
            n = 1 if s == "single" else self.n
            for p in per_dev:
                for m in micro:
                    for prec in precisions:
                        for comp in compiles:
                            for c in cl:
                                cand = Candidate(s, spec, n, p * self.n, m, prec, comp, c)
                                why = self._why_not(cand, devices[spec], plan)
                                if why:
                                    self.skipped.append((cand.label, why))
                                else:
                                    out.append(cand)
        return out

    def config_of(self, cand: Candidate) -> RunConfig:
        """The preset with the candidate's strategy, devices and settings."""
        changes = [("tune", "strategy.name", cand.strategy), ("tune", "devices.spec", cand.spec),
                   *[("tune", k, v) for k, v in cand.settings().items()]]
        if self.kind == "gpu":
            changes.append(("tune", "devices.fallback", "none"))
        return apply_overrides(self.base, changes)

    def _why_not(self, cand: Candidate, devices: list, plan) -> str | None:
        try:
            plan.validate(self.config_of(cand), devices, "tune")
        except ConfigError as exc:
            return str(exc).removeprefix("tune: ")
        return None

    # -- the budget ------------------------------------------------------------------------

    def least_budget_s(self) -> tuple[float, str]:
        """The least budget that buys one confirming run, before anything is measured, and
        how it is made up: the one-device step measured for the prediction (free when kept)
        plus one confirming run of ``steps`` steps at that step's time (a start-up guess
        where nothing is kept)."""
        cfg0 = self._cfg0()
        kept = Measurer(cfg0, self.kind, self.measure_dir, line=lambda text: None,
                        measure=False, cache=Cache()).compute(
            cfg0.optim.batch_size, 0 if self.kind == "gpu" else cores(), 1)
        if kept and kept.get("step_time_s"):
            step = float(kept["step_time_s"])
            return (START_GUESS_S + self.steps * step,
                    f"a start-up of about {START_GUESS_S:g} s and {self.steps} steps of "
                    f"{step * 1000:,.0f} ms, the kept one-device step")
        return (2 * START_GUESS_S,
                f"the one-device step measured, then one run, about {START_GUESS_S:g} s of "
                f"start-up each at least")

    def _reserve_s(self) -> float:
        """What one confirming run is expected to take: kept free while measuring."""
        return (self._start_s or START_GUESS_S) + self.steps * self._t_1

    def _cfg0(self) -> RunConfig:
        base = self.preset_candidate()
        return self.base.replace(optim={"batch_size": base.batch, "scale_with_devices": False})

    # -- the prediction --------------------------------------------------------------------

    def predict(self, cands: list[Candidate]) -> list[Ranked]:
        """Measure what the prediction needs (the preset's inputs, then each setting's factor,
        cheapest first, while the budget lasts) and rank every candidate."""
        base = self.preset_candidate()
        cfg0 = self._cfg0()
        cache = Cache()
        threads = 0 if self.kind == "gpu" else cores()

        def measurer(cfg: RunConfig) -> Measurer:
            return Measurer(cfg, self.kind, self.measure_dir, line=self.line, cache=cache)

        m0 = measurer(cfg0)
        multi = sorted({c.strategy for c in cands if c.strategy != "single"})
        self.line(f"measuring the prediction's inputs (single on 1 device"
                  f"{', then ' + ', '.join(multi) + f' on {self.n}' if multi else ''}; kept "
                  f"figures are reused)")
        t = time.monotonic()
        inp1 = m0.inputs(1, [])
        one_s = time.monotonic() - t  # what one one-device measurement costs here
        inps, preds = {"single": inp1}, {"single": predict("single", inp1)}
        if inp1.t_1:  # a run's start-up and evaluation here: its wall time less its steps
            self._start_s = max(0.0, one_s - MEASURE_STEPS * inp1.t_1)
            self._t_1 = inp1.t_1
        est = 2 * one_s
        for s in multi:  # one strategy at a time, while the budget lasts (one run kept free)
            if self.elapsed() + est + self._reserve_s() > self.budget_s:
                self.budget_notes.append(f"not measured: {s}'s inputs (they would end after "
                                         f"the {self.budget_s / 60:g} min budget)")
                continue
            t = time.monotonic()
            inps[s] = m0.inputs(self.n, [s])
            preds[s] = predict(s, inps[s])
            est = time.monotonic() - t
        factors: dict[tuple[str, Any], float | None] = {}
        batch_f: dict[int, float | None] = {base.batch: 1.0}
        wanted = sorted({(k, v) for c in cands for k, v in _changes(c, base).items()},
                        key=lambda kv: (kv[0] == "run.compile", kv[0], str(kv[1])))
        jobs: list[tuple[str, Any, Callable[[], float | None]]] = [
            (k, v, self._factor(measurer(cfg0_with(cfg0, k, v)), base.batch, threads,
                                inp1.t_1)) for k, v in wanted]
        jobs += [("optim.batch_size", b, self._factor(m0, b, threads, inp1.t_1))
                 for b in sorted({c.batch for c in cands} - {base.batch})]
        for key, value, job in jobs:
            if not inp1.t_1:
                break
            est = one_s * (3 if key == "run.compile" else 1)
            kept = getattr(job, "kept", False)
            if not kept and self.elapsed() + est + self._reserve_s() > self.budget_s:
                self.budget_notes.append(
                    f"not measured: the one-device step with {key}={value} (it would end "
                    f"after the {self.budget_s / 60:g} min budget)")
                continue
            if key == "optim.batch_size":
                batch_f[value] = job()
            else:
                factors[(key, value)] = job()
        limit = self._mem_limit()
        ranked = []
        for c in cands:
            if c.strategy not in preds:
                ranked.append(Ranked(c, reason="its inputs were not measured within the budget"))
                continue
            ranked.append(rank(c, base, preds[c.strategy], inps[c.strategy], factors,
                               batch_f.get(c.batch), limit))
        self.ranked = order(ranked)
        return self.ranked

    def _factor(self, m, batch: int, threads: int, t_1: float):
        """A job measuring the one-device step of ``m``'s config at ``batch``, over ``t_1``;
        its ``kept`` attribute says whether the figure is kept (free)."""
        device = f"gpu:{getattr(m, '_gpu_label', '')}" if self.kind == "gpu" else "cpu"
        hit = m.cache.get(compute_key(m.cfg, batch, threads, 1, device))

        def job() -> float | None:
            got = m.compute(batch, threads, 1)
            return got["step_time_s"] / t_1 if got and t_1 else None

        job.kept = hit is not None and stale(hit) is None  # type: ignore[attr-defined]
        return job

    def _mem_limit(self) -> int | None:
        """The bytes a device may be predicted to use (GPU: its memory; CPU: the free RAM
        shared by the devices)."""
        if self.kind == "gpu":
            from gputui.hw.discovery import discover_gpus

            gpus, _ = discover_gpus()
            totals = [g.mem_total for g in gpus[:self.n] if g.mem_total]
            return int(min(totals) * MEM_SHARE) if totals else None
        import psutil

        return int(psutil.virtual_memory().available * MEM_SHARE / max(1, self.n))

    # -- the confirming runs ---------------------------------------------------------------

    def plan_confirm(self) -> list:
        """The sweep of the top candidates' short runs, and its points (not started)."""
        top = [r for r in self.ranked if not r.reason][:self.top]
        caps = [("tune", "run.log_every", 5), ("tune", "run.checkpoint", False),
                ("tune", "run.name", f"tune-{self.base.run.name}"[:40])]
        self.sweep = sw = Sweep.new(self.preset, self.sets, sorted({r.cand.spec for r in top}),
                                    sorted({r.cand.strategy for r in top}), False,
                                    self.runs_dir, [*self.overrides, *caps], self.kind)
        # tune's own mark in the manifest: a `gputui sweep` of the same preset, devices and
        # strategies never takes this one for its own unfinished sweep and resumes it
        sw.manifest.axes = {"tune": [r.cand.label for r in top]}
        sw.manifest.points = []
        for r in top:
            p = Point(r.cand.strategy, r.cand.spec, r.cand.spec,
                      settings={**r.cand.settings(), **self._length(r.cand)})
            sw.manifest.points.append(p)
            self._wall[p.key] = (None, r)
        sw.gate = self._gate
        return sw.manifest.points

    def confirm(self, supervisor=None, on_point=None, on_event=None) -> str:
        """Run the planned sweep (:meth:`plan_confirm`); "finished" or "interrupted"."""
        if self.sweep is None:
            self.plan_confirm()
        sw = self.sweep
        sw.supervisor = supervisor

        def point(p) -> None:
            started, r = self._wall.get(p.key, (None, None))
            if p.status == "running":
                self._wall[p.key] = (time.monotonic(), r)
            elif started is not None and r is not None and r.step_s:
                took = time.monotonic() - started
                self._start_s = max(self._start_s, took - r.step_s * self.steps)
            if on_point:
                on_point(p)

        return sw.run(point, on_event or (lambda p, e: None))

    def _length(self, cand: Candidate) -> dict[str, Any]:
        """A confirming run's length: ``steps`` steps, in one epoch where the preset's
        training set allows, else in as many epochs of it as they need."""
        want = cand.batch * self.steps
        have = self.base.data.train_size
        if not have or have >= want:
            return {"data.train_size": want, "run.epochs": 1}
        return {"data.train_size": have, "run.epochs": math.ceil(want / have)}

    def _gate(self, point) -> str | None:
        """None when the point's run fits in what is left of the budget, else why not (and
        no later point runs either). The first always runs: the budget kept its time free
        (``least_budget_s``, ``_reserve_s``)."""
        if not self._admitted:
            self._admitted += 1
            return None
        _, r = self._wall.get(point.key, (None, None))
        est = (self._start_s or START_GUESS_S) + (r.step_s * self.steps if r and r.step_s
                                                  else 0.0)
        left = self.budget_s - self.elapsed()
        if self._over or est > left:
            self._over = True
            return (f"not confirmed: the time budget ({self.budget_s / 60:g} min) has "
                    f"{max(0.0, left):.0f} s left, this run needs about {est:.0f} s")
        return None


def _changes(c: Candidate, base: Candidate) -> dict[str, Any]:
    return axis_changes(c, base)


def cfg0_with(cfg: RunConfig, key: str, value: Any) -> RunConfig:
    """``cfg`` with one setting changed (the factor's measuring config)."""
    table, name = key.split(".")
    return cfg.replace(**{table: {name: value}})
