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
             cache: TraceCache | None = None) -> dict[str, dict]:
    """Figures for every job ({"kind", "spec", "label"}), from the cache or traced now in one
    spawned child (progress on ``line``); a job that failed gives {"error"}."""
    cache = cache or TraceCache()
    out: dict[str, dict] = {}
    todo = []
    for job in jobs:
        key = job_key(job.get("kind", "trace"), job["spec"])
        got = cache.get(key)
        if got is not None and "error" not in got:
            out[key] = got
        else:
            todo.append(dict(job, key=key))
    if not todo:
        return out
    n = workers(len(todo))
    line(f"tracing {len(todo)} mesh(es) in {n} child process(es) ({len(jobs) - len(todo)} kept "
         f"from earlier plans); loading torch ...")
    def keep(key: str, value: dict) -> None:  # as each arrives: a stopped plan keeps them
        if "error" not in value:
            cache.put(key, value)

    out.update(_spawn(todo, line, timeout, keep, n))
    return out


JOBS_PER_WORKER = 3  # a child's torch import costs about as much as tracing a mesh or two


def workers(jobs: int, cores: int | None = None) -> int:
    """How many tracing children for ``jobs`` meshes: one a core this process may use (each
    traces its share; a trace is single-threaded Python), none idle, and one for a few
    jobs (a child's torch import is not worth a mesh's trace)."""
    if cores is None:
        from gputui.runs.predict_cache import cores as own_cores

        cores = own_cores()
    return max(1, min(cores, jobs // JOBS_PER_WORKER))


def shares(jobs: list[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    """``jobs`` dealt to ``n`` children in turn (the candidates come grouped by mesh family,
    so each child gets a like mix of cheap and dear ones); none empty."""
    return [part for part in (jobs[i::n] for i in range(n)) if part]


def trace_main(jobs: list[dict[str, Any]], q: Any) -> None:
    """Spawned entry point of the plan's tracing child (not a run: it records nothing and
    holds no real tensor); torch is imported here, never in the CLI process."""
    from gputui.train import plan_trace

    plan_trace.main(jobs, q)


def _spawn(jobs: list[dict[str, Any]], line: Line, timeout: float,
           keep: Callable[[str, dict], None], n: int = 1) -> dict[str, dict]:
    from gputui.core import signals
    from gputui.core.proctree import kill_tree, own_tracker

    own_tracker()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=trace_main, args=(part, q), name=f"gputui-plan-trace-{i}")
             for i, part in enumerate(shares(jobs, n))]
    with signals.deferred():
        for proc in procs:
            proc.start()
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    done = 0
    try:
        while done < len(procs):
            signals.raise_if_stopped()
            try:
                msg = q.get(timeout=0.5)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                if time.monotonic() > deadline:
                    break
                continue
            if msg[0] == "line":
                line(f"{msg[1]} ({time.monotonic() - t0:.0f} s)")
            elif msg[0] == "result":
                out[msg[1]] = msg[2]
                keep(msg[1], msg[2])
            elif msg[0] == "done":
                done += 1
    except BaseException:
        for proc in procs:
            kill_tree(proc.pid)
        raise
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                kill_tree(proc.pid)
                proc.join(timeout=5)
    codes = ", ".join(str(p.exitcode) for p in procs)
    for job in jobs:
        out.setdefault(job["key"], {"error": "the tracer ended before this mesh (exit code "
                                             f"{codes})"})
    return out
