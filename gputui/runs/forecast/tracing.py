"""The parent side of the tracer: jobs to spawned children (``gputui.train.plan_trace``,
where torch is imported; one a core, each tracing its share), their figures kept in
``<cache>/plan-traces.json`` by what they depend on, so a mesh already traced answers at once
(torch-free)."""

from __future__ import annotations

import json
import multiprocessing as mp
import queue as queue_mod
import time
from pathlib import Path
from typing import Any, Callable

from gputui import __version__
from gputui.core.cachedir import cache_dir

Line = Callable[[str], None]
TRACE_VERSION = 4  # raised when the tracer's figures change meaning


def job_key(kind: str, spec: dict[str, Any]) -> str:
    return f"{kind}|v{TRACE_VERSION}|{__version__}|" + json.dumps(spec, sort_keys=True)


class TraceCache:
    """The kept traces: key -> figures (a JSON file written atomically)."""

    def __init__(self, folder: Path | None = None) -> None:
        from gputui.runs.predict_cache import Cache

        self.cache = Cache((folder or cache_dir()) / "plan-traces.json")

    def get(self, key: str) -> dict | None:
        return self.cache.get(key)

    def put(self, key: str, value: dict) -> None:
        from gputui.runs.predict_cache import Cache

        try:  # what another plan kept since this one read the file stays kept
            self.cache.data = dict(Cache(self.cache.path).data, **self.cache.data)
            self.cache.put(key, value)
        except Exception:  # noqa: BLE001 - a read-only cache: traced again next time
            pass


def run_jobs(jobs: list[dict[str, Any]], line: Line, timeout: float = 1800.0,
             cache: TraceCache | None = None, tracer: Tracer | None = None) -> dict[str, dict]:
    """Figures for every job ({"kind", "spec", "label"}), from the cache or traced now in
    spawned children (``tracer``'s, kept for more rounds, else started and ended here;
    progress on ``line``); a job that failed gives {"error"}."""
    if tracer is not None:
        return tracer.run(jobs)
    with Tracer(line, timeout, cache) as own:
        return own.run(jobs)


class Tracer:
    """The tracing children of one plan, kept over its rounds (a second round, checkpointing,
    does not import torch again): started by the first round with jobs to trace (one a core,
    :func:`workers`), each taking the next job from one queue as it finishes one (so none
    idles while another has several left); ended by :meth:`close` (a context manager: no
    child outlives it)."""

    def __init__(self, line: Line, timeout: float = 1800.0,
                 cache: TraceCache | None = None) -> None:
        self.line, self.timeout = line, timeout
        self.cache = cache or TraceCache()
        self.procs: list[Any] = []
        self.jobs_q: Any = None
        self.q: Any = None
        self.t0 = 0.0

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is not None:  # stopped (a progress line raised, ^C): no waiting for a trace
            self._kill()
        self.close()

    def run(self, jobs: list[dict[str, Any]]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        todo = []
        for job in jobs:
            key = job_key(job.get("kind", "trace"), job["spec"])
            got = self.cache.get(key)
            if got is not None and "error" not in got:
                out[key] = got
            else:
                todo.append(dict(job, key=key))
        if not todo:
            return out
        kept = len(jobs) - len(todo)
        if self.procs:
            self.line(f"tracing {len(todo)} mesh(es) in the {len(self.procs)} child "
                      f"process(es) started ({kept} kept from earlier plans)")
        else:
            self._start(workers(len(todo)))
            self.line(f"tracing {len(todo)} mesh(es) in {len(self.procs)} child process(es) "
                      f"({kept} kept from earlier plans); loading torch ...")
        out.update(self._collect(todo))
        return out

    def _start(self, n: int) -> None:
        from gputui.core import signals
        from gputui.core.proctree import own_tracker

        own_tracker()
        ctx = mp.get_context("spawn")
        self.jobs_q, self.q = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=trace_main, args=(self.jobs_q, self.q, i),
                                  name=f"gputui-plan-trace-{i}") for i in range(n)]
        with signals.deferred():
            for proc in self.procs:
                proc.start()
        self.t0 = time.monotonic()

    def _collect(self, todo: list[dict[str, Any]]) -> dict[str, dict]:
        from gputui.core import signals

        for job in todo:
            self.jobs_q.put(job)
        waiting = {job["key"] for job in todo}
        held: dict[int, str] = {}  # child -> the job it traces now
        out: dict[str, dict] = {}
        deadline = time.monotonic() + self.timeout
        try:
            while waiting:
                signals.raise_if_stopped()
                try:
                    msg = self.q.get(timeout=0.5)
                except queue_mod.Empty:
                    for i, proc in enumerate(self.procs):  # a child that died: its job failed
                        if not proc.is_alive() and held.get(i) in waiting:
                            key = held.pop(i)
                            waiting.discard(key)
                            out[key] = {"error": f"the tracer ended in this mesh (exit code "
                                                 f"{proc.exitcode})"}
                    if not any(p.is_alive() for p in self.procs) or \
                            time.monotonic() > deadline:
                        break
                    continue
                if msg[0] == "start":
                    held[msg[1]] = msg[2]
                    self.line(f"  {msg[3]} ({time.monotonic() - self.t0:.0f} s)")
                elif msg[0] == "result":
                    out[msg[1]] = msg[2]
                    waiting.discard(msg[1])
                    if "error" not in msg[2]:  # as each arrives: a stopped plan keeps them
                        self.cache.put(msg[1], msg[2])
        except BaseException:  # stopped: the children go now, mid-trace or not
            self._kill()
            raise
        codes = ", ".join(str(p.exitcode) for p in self.procs)
        for key in waiting:
            out.setdefault(key, {"error": f"the tracer ended before this mesh (exit code "
                                          f"{codes})"})
        return out

    def _kill(self) -> None:
        from gputui.core.proctree import kill_tree

        for proc in self.procs:
            kill_tree(proc.pid)
            proc.join(timeout=5)
        self.procs = []

    def close(self) -> None:
        """End the children: each is told there is no more, then joined (killed if it does
        not end)."""
        from gputui.core.proctree import kill_tree

        for _ in self.procs:
            try:
                self.jobs_q.put(None)
            except (OSError, ValueError):
                break
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                kill_tree(proc.pid)
                proc.join(timeout=5)
        self.procs = []


JOBS_PER_WORKER = 3  # a child's torch import costs about as much as tracing a mesh or two


def workers(jobs: int, cores: int | None = None) -> int:
    """How many tracing children for ``jobs`` meshes: one a core this process may use (each
    traces its share; a trace is single-threaded Python), none idle, and one for a few
    jobs (a child's torch import is not worth a mesh's trace)."""
    if cores is None:
        from gputui.runs.predict_cache import cores as own_cores

        cores = own_cores()
    return max(1, min(cores, jobs // JOBS_PER_WORKER))


def trace_main(jobs: Any, q: Any, index: int = 0) -> None:
    """Spawned entry point of a plan's tracing child (not a run: it records nothing and
    holds no real tensor); torch is imported here, never in the CLI process. ``jobs``: the
    queue it takes jobs from until a None (a list: those jobs)."""
    from gputui.train import plan_trace

    if isinstance(jobs, list):
        plan_trace.main(jobs, q)
    else:
        plan_trace.serve(jobs, q, index)
