"""The measured side of the plan's error: a mesh run for real on CPU ranks of a gloo group,
the same model and parallelism code on real tensors under the same memory tracker
(``gputui.train.plan_trace.measure_rank``), its peak per rank and its step time. Used by
benchmarks/bench_plan.py and the tests (torch-free here: the ranks are spawned)."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gputui.core.proctree import ask_children


def measure_main(rank: int, world: int, port: int, spec: dict[str, Any], threads: int,
                 q: Any) -> None:
    """Spawned entry point of one measuring rank (not a run: it records nothing)."""
    from gputui.train.plan_trace import measure_rank

    measure_rank(rank, world, port, spec, threads, q)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_copies(spec: dict[str, Any], threads: int, copies: int,
                   timeout: float = 600.0) -> dict[str, Any]:
    """A one-rank ``spec`` measured in ``copies`` groups at once (each of ``threads``
    threads: the cores shared as ``copies`` ranks share them); the slowest copy's figures."""
    with ThreadPoolExecutor(copies) as pool:
        got = list(pool.map(lambda _: measure_mesh(dict(spec, world=1), threads, timeout),
                            range(copies)))
    bad = next((g for g in got if "error" in g), None)
    return bad or max(got, key=lambda g: g["seconds"])


def measure_mesh(spec: dict[str, Any], threads: int, timeout: float = 600.0) -> dict[str, Any]:
    """Rank 0's figures of ``spec``'s mesh measured on ``spec["world"]`` real CPU ranks of
    ``threads`` threads each ({"error"} when it failed); no rank outlives the call. The ranks
    are this process's children, their group on a free port (no elastic agent: each is told
    its rank)."""
    return _measure(spec, int(spec["world"]), threads, timeout)


def measure_meshes(specs: list[dict[str, Any]], threads: int,
                   timeout: float = 600.0) -> list[dict[str, Any]]:
    """:func:`measure_mesh` of several meshes of one world in one launch (one group of ranks
    measures each in turn): their figures in order, or one {"error"} for each."""
    got: Any = _measure(specs, int(specs[0]["world"]), threads, timeout)
    return got if isinstance(got, list) else [got] * len(specs)


def _measure(spec: Any, world: int, threads: int, timeout: float) -> Any:
    port = _free_port()
    answer = ask_children([(measure_main, (r, world, port, spec, threads)) for r in range(world)],
                          "gputui-plan-measure", timeout, grace_s=30.0)
    if answer.complete:
        return answer.messages[0]
    if answer.timed_out:
        return {"error": f"no figures within {timeout:g} s"}
    return {"error": f"the measuring ranks exited with codes {answer.exitcodes}"}
