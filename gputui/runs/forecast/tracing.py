"""The parent side of the tracer: jobs to one spawned child (``gputui.train.plan_trace``,
where torch is imported), their figures kept in ``<cache>/plan-traces.json`` by what they
depend on, so a mesh already traced answers at once (torch-free)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from gputui import __version__
from gputui.core.cachedir import KeptFigures, cache_dir
from gputui.core.proctree import ask_children

Line = Callable[[str], None]
TRACE_VERSION = 4  # raised when the tracer's figures change meaning


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
    line(f"tracing {len(todo)} mesh(es) in a child process ({len(jobs) - len(todo)} kept from "
         f"earlier plans); loading torch ...")
    def keep(key: str, value: dict) -> None:  # as each arrives: a stopped plan keeps them
        if "error" not in value:
            cache.put(key, value)

    out.update(_spawn(todo, line, timeout, keep))
    return out


def trace_main(jobs: list[dict[str, Any]], q: Any) -> None:
    """Spawned entry point of the plan's tracing child (not a run: it records nothing and
    holds no real tensor); torch is imported here, never in the CLI process."""
    from gputui.train import plan_trace

    plan_trace.main(jobs, q)


def _spawn(jobs: list[dict[str, Any]], line: Line, timeout: float,
           keep: Callable[[str, dict], None]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    t0 = time.monotonic()

    def heard(msg: tuple) -> bool:  # ("line", text), ("result", key, figures) or ("done",)
        if msg[0] == "line":
            line(f"{msg[1]} ({time.monotonic() - t0:.0f} s)")
        elif msg[0] == "result":
            out[msg[1]] = msg[2]
            keep(msg[1], msg[2])
        return msg[0] == "done"

    answer = ask_children([(trace_main, (jobs,))], "gputui-plan-trace", timeout, done=heard)
    for job in jobs:
        out.setdefault(job["key"], {"error": "the tracer ended before this mesh (exit code "
                                             f"{answer.exitcodes[0]})"})
    return out
