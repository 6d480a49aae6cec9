"""Sweeps: a preset run over a grid of device counts x strategies, one run after another.

Fast-path axes multiply the grid: run.precision, run.compile and run.channels_last can each
take several values (``AXES``), so one sweep shows what each buys on the user's hardware; so
can data.context (``--contexts``: single against cp as the context grows).

Each point is checked before it starts as every run is (``gputui.runs.prepare``: its devices
resolved once, every rule, the disk); a point that cannot run here is recorded as skipped with
the reason. Every run goes through ``launcher.launch``, handed the devices already resolved (a
spawned process, so this module never imports torch), and leaves its normal record under the
runs folder. The sweep's manifest, ``<runs>/sweeps/<sweep id>.json``, is rewritten atomically
after every change of state, so an interrupted sweep resumes where it stopped: finished points
are never run again.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from gputui.core import safeio
from gputui.core import runstore
from gputui.core.config import ConfigError, RunConfig, load_preset
from gputui.core.devices import Device
from gputui.core.filewrite import WriteFailed, write_atomic
from gputui.core import machine
from gputui.runs.sweep.manifest_size import INDENT, MANIFEST_LIMIT, POINT_BYTES, fit_point
from gputui.runs.sweep.grid import (KIND_WORDS, KINDS, axis_grid, parse_axis,  # noqa: F401
                                    parse_devices, resolve_kind, spec_for)
from gputui.core import registry, signals
from gputui.core.errors import UserError
from gputui.runs import runlock, warm
from gputui.runs.ids import find_sweep
from gputui.runs.launcher import launch
from gputui.runs.prepare import prepare

# fast-path axes: the config key a sweep varies, and how a point's key names it
AXES = {"run.precision": "precision", "run.compile": "compile",
        "run.channels_last": "channels_last", "data.context": "context"}


@dataclass
class Point:
    """One cell of the grid and what became of it."""

    strategy: str
    devices: str  # the device choice as given ("2", "cpu*2")
    spec: str  # the devices.spec the run uses
    status: str = "pending"  # pending | running | finished | failed | stopped | skipped
    run_id: str = ""
    reason: str = ""
    settings: dict = field(default_factory=dict)  # fast-path axis values, e.g. run.compile
    rep: int = 0  # which repetition (1..N) under --repeat N; 0: the sweep measures once
    session: int = 0  # the sweep invocation that ran it (a resumed sweep has several)
    # what else used the hardware while it ran (gputui.hw.contention; {}: not recorded)
    machine: dict = field(default_factory=dict)

    @property
    def group(self) -> str:
        """The grid cell, the same for every repetition."""
        # a key outside AXES (tune's micro-batches, batch) is named by its field
        extra = "".join(f" {AXES.get(k, k.rsplit('.', 1)[-1])}={v}"
                        for k, v in self.settings.items())
        return f"{self.strategy}@{self.devices}{extra}"

    @property
    def key(self) -> str:
        return self.group + (f" #{self.rep}" if self.rep else "")


@dataclass
class Manifest:
    """The sweep's own record: its parameters and the state of every point."""

    sweep_id: str
    preset: str  # the preset file's path
    sets: list = field(default_factory=list)  # the --set assignments, as typed
    devices: list = field(default_factory=list)
    strategies: list = field(default_factory=list)
    scale_with_devices: bool = False
    kind: str = "cpu"  # what the counts are: "gpu" (GPUs) or "cpu" (CPU virtual devices)
    state: str = "running"  # running | interrupted | finished
    created: float = field(default_factory=time.time)
    points: list = field(default_factory=list)  # list[Point]
    axes: dict = field(default_factory=dict)  # config key -> values swept (see AXES)
    repeat: int = 1  # each point runs this many times (--repeat), repetitions interleaved
    sessions: int = 0  # how many times the sweep was run (resumed: more than one)

    def params(self) -> dict[str, Any]:
        """What makes two sweeps the same experiment (for automatic resume)."""
        return {"preset": self.preset, "sets": list(self.sets), "devices": list(self.devices),
                "strategies": list(self.strategies), "scale": self.scale_with_devices,
                "kind": self.kind, "axes": dict(self.axes), "repeat": self.repeat}

    def kind_words(self) -> str:
        """The kind of device the counts are, for titles: "GPUs" or "CPU virtual devices"."""
        return KIND_WORDS[self.kind]

    def save(self, runs_dir: Path) -> Path:
        """Write the manifest atomically (a reader never sees half a file)."""
        path = manifest_path(runs_dir, self.sweep_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteFailed(path.parent, exc) from None
        for i, p in enumerate(self.points):  # each within POINT_BYTES, fitted once
            if len(p.reason) + len(repr(p.machine)) > POINT_BYTES // 4:
                self.points[i] = Point(**fit_point(asdict(p)))
        return write_atomic(path, json.dumps(asdict(self), indent=INDENT) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Manifest":
        points = [Point(**p) for p in data.pop("points", [])]
        return cls(**data, points=points)


def manifest_path(runs_dir: Path, sweep_id: str) -> Path:
    """Where a sweep's manifest lives."""
    return Path(runs_dir) / "sweeps" / f"{sweep_id}.json"


def load_manifest(runs_dir: Path, sweep_id: str) -> Manifest:
    """A saved manifest, by its id or a unique part of it (``gputui.runs.ids``); LookupError
    (one line) when missing, ambiguous or unreadable."""
    path = manifest_path(runs_dir, find_sweep(sweep_id, runs_dir))
    try:
        return Manifest.from_dict(json.loads(safeio.read_text(path, MANIFEST_LIMIT)))
    except FileNotFoundError:  # gone since it was listed
        raise LookupError(f"no sweep '{sweep_id}' under {runs_dir}/sweeps") from None
    except (OSError, ValueError, TypeError) as exc:
        raise LookupError(f"sweep manifest {path} is unreadable ({exc}); start a new sweep") \
            from None


def list_manifests(runs_dir: Path) -> list[Manifest]:
    """Every readable sweep manifest, newest first."""
    folder = Path(runs_dir) / "sweeps"
    out = []
    for path in sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []:
        try:
            out.append(Manifest.from_dict(json.loads(safeio.read_text(path, MANIFEST_LIMIT))))
        except (OSError, ValueError, TypeError):
            continue
    return out


class Sweep:
    """Plans and runs the grid; ``request_stop()`` (any thread) ends it after a graceful stop."""

    def __init__(self, manifest: Manifest, runs_dir: Path, overrides: list[tuple[str, str, Any]]):
        self.manifest, self.runs_dir, self.overrides = manifest, Path(runs_dir), overrides
        self.stop_requested = False
        self.lock: Any = None  # runlock.RunLock: this process runs the sweep (see claim)
        # headless: the process's Supervisor (signals.py), which turns SIGINT, SIGTERM and
        # SIGHUP into the current point's graceful stop, then the kill; None in the app
        self.supervisor = None
        # before a point starts: None to run it, else why it is skipped (tune's time budget)
        self.gate: Callable[[Point], str | None] | None = None
        self.base = load_preset(manifest.preset, overrides)
        if not manifest.points:  # repetitions outermost: each pass measures the whole grid
            reps = range(1, manifest.repeat + 1) if manifest.repeat > 1 else [0]
            manifest.points = [Point(s, d, spec_for(d, manifest.kind), settings=dict(a),
                                     rep=r)
                               for r in reps for d in manifest.devices
                               for s in manifest.strategies for a in axis_grid(manifest.axes)]

    @classmethod
    def new(cls, preset: str, sets: list[str], devices: list[str], strategies: list[str],
            scale: bool, runs_dir: Path, overrides: list, kind: str = "cpu",
            axes: dict | None = None, repeat: int = 1) -> "Sweep":
        """A fresh sweep (not saved until ``run``); ``kind`` as :func:`resolve_kind` gave,
        ``axes`` the fast-path axes (see ``AXES``), ``repeat`` the runs of each point."""
        name = load_preset(preset, overrides).run.name
        sweep_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{name[:30]}-{secrets.token_hex(2)}"
        manifest = Manifest(sweep_id, str(preset), list(sets), list(devices), list(strategies),
                            scale, kind, axes=dict(axes or {}), repeat=max(1, repeat))
        return cls(manifest, runs_dir, overrides)

    @classmethod
    def from_config(cls, cfg: RunConfig, devices: list[str], strategies: list[str],
                    scale: bool, runs_dir: Path, kind: str = "cpu") -> "Sweep":
        """A fresh sweep of a config that has no preset file (the app's form): the config is
        written beside the manifest, as ``<sweep id>.toml``, so the sweep can resume."""
        sweep_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.run.name[:30]}-{secrets.token_hex(2)}"
        path = Path(runs_dir) / "sweeps" / f"{sweep_id}.toml"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteFailed(path.parent, exc) from None
        write_atomic(path, cfg.to_toml())
        manifest = Manifest(sweep_id, str(path), [], list(devices), list(strategies), scale,
                            kind)
        return cls(manifest, runs_dir, [])

    def config_for(self, point: Point) -> RunConfig:
        """The point's config: the preset, the --set overrides, its strategy and devices."""
        changes: list[tuple[str, str, Any]] = [("sweep", "strategy.name", point.strategy),
                   ("sweep", "devices.spec", point.spec)]
        if self.manifest.kind == "gpu":  # a GPU point never runs quietly on the CPU instead
            changes.append(("sweep", "devices.fallback", "none"))
        if self.manifest.scale_with_devices:
            changes.append(("--scale-with-devices", "optim.scale_with_devices", True))
        changes += [("sweep", key, value) for key, value in point.settings.items()]
        return load_preset(self.manifest.preset, [*self.overrides, *changes])

    def why_not(self, point: Point, cfg: RunConfig) -> str | None:
        """None when the point can run here, else the reason (one line)."""
        return self.check(point, cfg)[2]

    def check(self, point: Point, cfg: RunConfig) -> tuple[list[Device], str, str | None]:
        """The point's devices (resolved once: discovery runs at most once per point), the
        fallback's note, and None when it can run here, else the reason (one line): the path
        of every run (``gputui.runs.prepare``), its refusal kept as the point's reason."""
        if registry.get(point.strategy) is None:  # e.g. a manifest from another build
            return [], "", (f"strategy '{point.strategy}' is not available in this build "
                            f"(known: {', '.join(registry.names())})")
        try:
            ready = prepare(cfg, "sweep")
        except ConfigError as exc:
            return [], "", str(exc).removeprefix("sweep: ")
        return ready.devices, ready.note, None

    def request_stop(self) -> None:
        """Stop the running point gracefully and run no further point."""
        self.stop_requested = True

    def save(self) -> Path:
        return self.manifest.save(self.runs_dir)

    def claim(self) -> None:
        """Hold the sweep for this process until ``run`` ends; raises runlock.InUse (one
        line) when another gputui process is running it (a second command must not run its
        points beside the first's)."""
        if self.lock is None:
            self.lock = runlock.claim_sweep(self.runs_dir, self.manifest.sweep_id)

    def release(self) -> None:
        """Give the sweep back (idempotent)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def run(self, on_point: Callable[[Point], object] = lambda p: None,
            on_event: Callable[[Point, Any], None] = lambda p, e: None) -> str:
        """Run every point not done yet; returns "finished" or "interrupted". Ctrl-C
        (KeyboardInterrupt) stops the current run gracefully, a second one kills it."""
        self.claim()
        try:
            return self._run(on_point, on_event)
        finally:
            self.release()

    def _run(self, on_point: Callable[[Point], object],
             on_event: Callable[[Point, Any], None]) -> str:
        m = self.manifest
        m.state = "running"
        m.sessions += 1
        self.save()
        for point in m.points:
            if self.supervisor is not None and self.supervisor.first is not None:
                self.stop_requested = True  # a signal between two points: start no other
            if point.status == "finished" or self.stop_requested:
                continue
            cfg = self.config_for(point)
            devices, note, reason = self.check(point, cfg)
            reason = reason or (self.gate(point) if self.gate is not None else None)
            if reason:
                point.status, point.reason, point.run_id = "skipped", reason, ""
                self.save()
                on_point(point)
                continue
            warm.ready_for(point.strategy, devices)
            try:
                handle = launch(cfg, self.runs_dir, devices, note)
            except signals.Interrupted:  # a signal since the check above: start no other
                self.stop_requested = True
                continue
            except (OSError, ValueError, UserError) as exc:  # e.g. an unwritable runs folder
                point.status, point.reason = "failed", f"could not start: {exc}"
                self.save()
                on_point(point)
                continue
            point.status, point.run_id, point.reason = "running", handle.run_id, ""
            point.session = m.sessions
            self.save()
            on_point(point)
            self._follow(handle, point, on_event)
            summary = runstore.read_summary(handle.run_dir)
            point.status = handle.status.value if handle.done else "stopped"
            point.reason = summary.reason
            point.machine = machine.read(handle.run_dir) or {}
            self.save()
            on_point(point)
        m.state = "interrupted" if self.stop_requested else "finished"
        self.save()
        return "interrupted" if self.stop_requested else "finished"

    def _follow(self, handle, point: Point, on_event) -> None:
        interrupts, asked = 0, False
        sup = self.supervisor
        while not handle.done:
            try:
                if sup is not None and sup.first is not None:
                    self.stop_requested = True
                    sup.check(handle, lambda text: None)  # the stop, then the kill
                    asked = True
                if self.stop_requested and not asked:
                    handle.stop()
                    asked = True
                for ev in handle.poll(timeout=0.2):
                    on_event(point, ev)
            except KeyboardInterrupt:
                interrupts += 1
                self.stop_requested = True
                if interrupts > 1:
                    handle.kill("killed by user (second Ctrl-C)")

    def run_dirs(self) -> list[Path]:
        """The record folders of the points that ran (in grid order)."""
        return [self.runs_dir / p.run_id for p in self.manifest.points
                if p.run_id and runstore.is_run_folder(self.runs_dir / p.run_id)]
