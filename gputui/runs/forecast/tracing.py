"""The parent side of the tracer: a plan's meshes traced in spawned children
(``gputui.train.plan_trace``, where torch is imported; one a core, each taking the next mesh
from one queue), their figures kept in ``<cache>/plan-traces.json`` by what they depend on, so
a mesh already traced answers at once (torch-free)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any, Callable

from gputui import __version__
from gputui.core.cachedir import KeptFigures, cache_dir
from gputui.core.proctree import ask_children, own_tracker
from gputui.hw.contention import busy_cores, load_average
from gputui.runs.predict.cache import cores as own_cores

Line = Callable[[str], None]
TRACE_VERSION = 14  # raised when the tracer's figures change meaning
BUSY_WINDOW_S = 0.5  # the cores busy now, read over this long (once a plan, as it traces)
JOBS_PER_WORKER = 3  # a child's torch import costs about as much as tracing a mesh or two


def job_key(kind: str, spec: dict[str, Any]) -> str:
    return f"{kind}|v{TRACE_VERSION}|{__version__}|" + json.dumps(spec, sort_keys=True)


class TraceCache:
    """The kept traces: key -> figures (a JSON file written atomically)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.cache = KeptFigures(path=(folder or cache_dir()) / "plan-traces.json")

    def get(self, key: str) -> dict | None:
        return self.cache.get(key)

    def put(self, key: str, value: dict) -> None:
        try:  # what another plan kept since this one read the file stays kept (put merges)
            self.cache.put(key, value)
        except Exception:  # noqa: BLE001 - a read-only cache: traced again next time
            pass


def workers(jobs: int, cores: int | None = None, load: float | None = None) -> int:
    """How many tracing children for ``jobs`` meshes: one a core this process may use that
    other work leaves free (its count less the 1-minute load average, rounded; each child
    traces its share, a trace is single-threaded Python), none idle, and one for a few jobs
    (a child's torch import is not worth a mesh's trace). A child more than the free cores
    only takes turns with the others: on this 2-core machine at load 3, GPT-2 small's 21
    meshes took 35 CPU-s and 49 s in two children, 27 CPU-s and 28 s in one."""
    cores = own_cores() if cores is None else cores
    if load is None:
        load = machine_load(cores)
    free = int(cores - load + 0.5)
    return max(1, min(cores, free, jobs // JOBS_PER_WORKER))


def machine_load(cores: int) -> float:
    """The machine's load as this process's share of it: the 1-minute load average, or the
    cores busy over the next half second where fewer (:func:`busy_cores`: the average still
    counts work that has ended, such as an earlier plan's children; a plan begun just after
    another took one child on this 2-core machine, GPT-2 small's 33 meshes on 8 GPUs in 49 s
    where two children took 31 s), scaled by the cores this process may use over the
    machine's (a job given 8 cores of a busy 128-core node is not the node's load)."""
    load = load_average() or 0.0
    now = busy_cores(BUSY_WINDOW_S)
    if now is not None:
        load = min(load, now)
    total = os.cpu_count() or cores
    return load * cores / total if 0 < cores < total else load


def run_jobs(jobs: list[dict[str, Any]], line: Line, timeout: float = 1800.0,
             cache: TraceCache | None = None, tracer: Tracer | None = None,
             on_result: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
    """Figures for every job ({"kind", "spec", "label"}), from the cache or traced now in
    spawned children (progress on ``line``; each job's figures to ``on_result`` as they
    come); a job that failed gives {"error"}."""
    return (tracer or Tracer(line, timeout, cache)).run(jobs, on_result)


class Tracer:
    """The tracing of one plan, round by round (the meshes, then the checkpointing ones):
    each round traces what the cache lacks in :func:`workers` children through
    ``proctree.ask_children`` (no child outlives its round; a stop raised from a progress
    line, or ^C, kills them at once). A context manager, as the planner holds one over its
    rounds."""

    def __init__(self, line: Line, timeout: float = 1800.0,
                 cache: TraceCache | None = None) -> None:
        self.line, self.timeout = line, timeout
        self.cache = cache or TraceCache()
        # the load as the plan began: a later round's reading would count this plan's own
        # children of the round before (the 1-minute average keeps them for a while)
        self.load: float | None = None

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def children(self, jobs: int) -> int:
        """How many children a round of ``jobs`` meshes takes (:func:`workers`), by the load
        as the plan began."""
        if self.load is None:
            self.load = machine_load(own_cores())
        return workers(jobs, load=self.load)

    def run(self, jobs: list[dict[str, Any]],
            on_result: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
        """Every job's figures (kept, or traced now); ``on_result`` told each job's as they
        come (kept ones at once, traced ones as each child ends its mesh, after they are
        kept): the planner's rows one by one (``make_plan``'s ``on_row``)."""
        out: dict[str, dict] = {}
        todo = []
        for job in jobs:
            key = job_key(job.get("kind", "trace"), job["spec"])
            got = self.cache.get(key)
            if got is not None and "error" not in got:
                out[key] = got
                if on_result is not None:
                    on_result(key, got)
            else:
                todo.append(dict(job, key=key))
        if todo:
            out.update(self._trace(todo, len(jobs) - len(todo), on_result))
        return out

    def _trace(self, todo: list[dict[str, Any]], kept: int,
               on_result: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
        n = self.children(len(todo))
        self.line(f"tracing {len(todo)} mesh(es) in {n} child process(es) ({kept} kept from "
                  f"earlier plans); loading torch ...")
        # the tracker that this queue's semaphores start is gputui's own (quiet about what a
        # stopped plan's killed children leave: ``own_tracker``), not a plain one that
        # ask_children would then find running
        own_tracker()
        queue = mp.get_context("spawn").Queue()  # the meshes, then one None a child
        for job in todo:
            queue.put(job)
        for _ in range(n):
            queue.put(None)
        waiting = {job["key"] for job in todo}
        out: dict[str, dict] = {}
        t0 = time.monotonic()
        pace = Pace(len(todo), n)

        def heard(msg: tuple) -> bool:  # ("start", child, key, label) or ("result", key, ...)
            if msg[0] == "start":
                self.line(f"  {msg[3]} {pace.started(time.monotonic() - t0)}")
            elif msg[0] == "result":
                pace.ended(time.monotonic() - t0)
                out[msg[1]] = msg[2]
                waiting.discard(msg[1])
                # as each arrives: a stopped plan keeps them; not an error, nor a figure of
                # this machine measured while other processes used it ("keep": False)
                if "error" not in msg[2] and msg[2].get("keep", True):
                    self.cache.put(msg[1], msg[2])
                if on_result is not None:  # last: what it raises loses no figure
                    on_result(msg[1], msg[2])
            return not waiting

        answer = ask_children([(trace_main, (queue, i)) for i in range(n)],
                              "gputui-plan-trace", self.timeout, done=heard)
        codes = ", ".join(str(c) for c in answer.exitcodes)
        for key in waiting:
            out.setdefault(key, {"error": f"the tracer ended before this mesh (exit code "
                                          f"{codes})"})
        return out


class Pace:
    """A round's progress as its children start meshes: which of how many, the time so far,
    and once two meshes a child have ended, about how long is left: the meshes left times the
    interval between the ends since each child's first (the children's pace together; their
    first meshes end close together, each after its child's torch import, which the later
    ones do not repeat: counting them as intervals had the estimate at two thirds of the
    pace with two children)."""

    def __init__(self, total: int, children: int) -> None:
        self.total, self.children = total, max(1, children)
        self.begun = 0
        self.ends: list[float] = []  # when each mesh ended, seconds into the round

    def started(self, now: float) -> str:
        self.begun += 1
        text = f"[{self.begun}/{self.total}, {now:.0f} s"
        left = self.left(now)
        return text + (f", about {left:.0f} s left]" if left is not None else "]")

    def ended(self, now: float) -> None:
        self.ends.append(now)

    def left(self, now: float) -> float | None:
        """Seconds left, or None before the pace is known (two turns of the children)."""
        done, first = len(self.ends), self.children - 1  # the children's first meshes' last
        if done < 2 * self.children or done >= self.total:
            return None
        each = (self.ends[-1] - self.ends[first]) / (done - 1 - first)
        return max(0.0, each * (self.total - done) - (now - self.ends[-1]))


def trace_main(jobs: Any, index: int, q: Any) -> None:
    """Spawned entry point of a plan's tracing child (not a run: it records nothing and
    holds no real tensor); torch is imported here, never in the CLI process. It takes meshes
    from ``jobs`` until a None."""
    from gputui.train import plan_trace

    plan_trace.serve(jobs, q, index)
