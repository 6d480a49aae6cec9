"""The CPU's links, measured in each mesh's own step (torch-free here: the ranks are spawned).

A GPU profile's collectives are a ring over the data sheet's bandwidth and latency
(``estimate.collective_time``). CPU ranks share the cores that compute: gloo copies and
reduces on them, and each call waits for the slowest rank, so on this machine a 1 MiB
all-reduce between compute took about 2.6 ms where the ring over bench-comm's peak gives 1.
For a plan of this machine's CPU (``--gpus cpu*N``), each mesh's traced collectives (its
calls' kinds, bytes and groups, in a step's order: forward, backward, optimizer) are run on N
gloo ranks between the mesh's planned compute cut into equal slices, as
``gputui predict`` measures fsdp's (``gputui.train.comm_ranks.meshes_rank``): what they add to
the step is the row's collectives' time. A step's compute over :data:`GAP_S` is replayed as
that much, cut the same way: GPT-2 small's plan on two cores has steps of about two minutes,
and six steps of each of its six meshes, replayed whole, would take over an hour. The calls
block, so each costs what it costs after any compute; what the shorter compute leaves out is
the ranks' drift over the rest of it, inside such a step's own noise. A pipeline's
stage-to-stage sends stay the formula's, and so do the rows that do not fit this machine's
memory (measuring their collectives would take it). One launch measures every mesh of a
plan; kept per machine, so a plan made again answers at once. One machine only: ``cpu*N
--nodes M`` keeps the formula.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from gputui.runs.forecast.estimate import RING, Row
from gputui.runs.forecast.profiles import Cluster
from gputui.runs.predict.cache import Cache, cores, machine_id

Line = Callable[[str], None]
OPS = {"all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
       "all-reduce": "all_reduce", "all-to-all": "all_to_all", "broadcast": "broadcast",
       RING: "ring"}
PHASES = ("forward", "backward", "optimizer")
SECONDS = 1.0  # of steps measured a mesh (at least 3 steps)
GAP_S = 1.0  # the most compute a measured step replays (the module's docstring)
LAUNCH_S = 5.0  # about what the measurement's start takes here: its processes' torch import
LINKS_VERSION = 2  # raised when the measurement changes (2: ZeRO-1's broadcasts as a run)
SOURCE = ("gloo measured on this machine in each mesh's step: its traced calls between its "
          "planned compute, on as many ranks (gputui.runs.forecast.links); pp's sends, and "
          f"the rows that do not fit, by formula; a step's compute over {GAP_S:g} s replayed "
          f"as {GAP_S:g} s")


def in_step(cluster: Cluster) -> bool:
    """Whether a plan of ``cluster`` measures its rows' collectives (:func:`measured`): this
    machine's CPU ranks, more than one, on one node."""
    return cluster.profile.kind == "cpu" and cluster.world > 1 and cluster.nodes == 1


def will_measure(row: Row, cluster: Cluster) -> bool:
    """Whether :func:`measured` measures ``row``'s collectives in its step: a plan of this
    machine's CPU ranks, a row that fits, with a step and a collective gloo runs here."""
    return (in_step(cluster) and row.step_s is not None and row.fits
            and bool(calls_of(row, cluster.world)))


def run_here(c: dict[str, Any], world: int) -> bool:
    """Whether collective ``c`` is measured on ``world`` ranks: a kind gloo runs here, called,
    over a group of more than one rank that divides the world (its ranks consecutive)."""
    group = int(c["group"])
    return c["kind"] in OPS and c["count"] > 0 and 1 < group <= world and world % group == 0


def calls_of(row: Row, world: int) -> list[tuple[str, int, int]]:
    """The row's collectives as calls (op, the bytes of one call, group size) in a step's
    order: by phase, the kinds of a phase taken in turn."""
    by_phase: dict[str, list[list[Any]]] = {}
    for c in row.comm:
        op = OPS.get(c["kind"])
        if op is None or not run_here(c, world):
            continue
        per = max(4, int(c["bytes"]) // int(c["count"]))
        by_phase.setdefault(c["phase"], []).append([op, per, int(c["group"]), int(c["count"])])
    out: list[tuple[str, int, int]] = []
    for phase in [*PHASES, *sorted(set(by_phase) - set(PHASES))]:
        kinds = by_phase.get(phase, [])
        while any(k[3] for k in kinds):
            for k in kinds:
                if k[3]:
                    out.append((k[0], k[1], k[2]))
                    k[3] -= 1
    return out


def measured(rows: list[Row], cluster: Cluster, line: Line,
             cache: Cache | None = None) -> bool:
    """For this machine's CPU ranks (a cpu profile of more than one rank): every row's
    collectives measured in its step (kept per machine), its step time and exposed
    collectives' time made of it. False when nothing was measured (a GPU profile, one rank,
    no collective, or the measurement failed: the ring formula stays, said on ``line``)."""
    if not in_step(cluster):
        return False
    cache = cache or Cache()
    threads = max(1, cores() // cluster.world)
    todo: dict[str, dict[str, Any]] = {}
    expects: dict[str, float] = {}  # the formula's step of each mesh to measure
    keys: dict[int, str] = {}
    for i, row in enumerate(rows):
        if not will_measure(row, cluster):
            continue
        calls = calls_of(row, cluster.world)
        # steps of about SECONDS, by the formula's step (the gap and its collectives)
        gap = min(row.compute_s, GAP_S)
        expect = gap + sum(c["seconds"] for c in row.comm if run_here(c, cluster.world))
        mesh = {"calls": [list(c) for c in calls], "gap": round(gap, 4),
                "iters": max(3, min(50, int(SECONDS / max(expect, 1e-3))))}
        keys[i] = key = (f"plan-links|v{LINKS_VERSION}|{machine_id()}|{cluster.world}|{threads}|"
                         + json.dumps(mesh, sort_keys=True))
        if cache.get(key) is None:
            todo[key] = mesh
            expects[key] = expect
    if todo:
        from gputui.runs import comm_bench

        # each mesh's warm-up and measured steps, at the formula's pace (gloo's is slower)
        about = LAUNCH_S + sum((m["iters"] + 3) * expects[k] for k, m in todo.items())
        line(f"measuring gloo's collectives in the step of {len(todo)} mesh(es) on "
             f"{cluster.world} CPU ranks (about {about:.0f} s) ...")
        # each mesh's steps (and 3 warm-up steps and the compute's calibration) at up to 5
        # times the formula's step: the formula's ring is faster than gloo here, never 5x
        budget = sum((m["iters"] + 4) * expects[k] * 5 for k, m in todo.items())
        got = comm_bench.measure({"what": "in_step", "n": cluster.world, "size": 0, "gap": 0,
                                  "kind": "cpu", "threads": threads,
                                  "meshes": list(todo.values())},
                                 120 + budget, "gputui-plan-links")
        if "error" in got:
            line(f"measuring the collectives failed ({got['error']}): the ring formula stays")
            return False
        for key, seconds in zip(todo, got["seconds"], strict=True):
            try:
                cache.put(key, {"seconds": float(seconds)})
            except Exception:  # noqa: BLE001 - a read-only cache: measured again next time
                todo[key]["seconds"] = float(seconds)
    for i, key in keys.items():
        kept = cache.get(key) or todo.get(key) or {}
        if "seconds" in kept:
            _apply(rows[i], float(kept["seconds"]), cluster.world)
    return bool(keys)


def _apply(row: Row, seconds: float, world: int) -> None:
    """The row's collectives' time: ``seconds`` measured for those run (each one's share in
    proportion to its formula's time), the formula's for the rest (pp's sends); the step,
    tokens/s and MFU follow."""
    run = [c for c in row.comm if run_here(c, world)]
    rest = [c for c in row.comm if not any(c is r for r in run)]
    formula = sum(c["seconds"] for c in run)
    for c in run:
        c["seconds"] = seconds * (c["seconds"] / formula if formula else 1 / len(run))
        c["measured"] = True
    before = row.step_s
    row.comm_exposed_s = seconds + sum(c["seconds"] for c in rest)
    row.step_s = row.compute_s + row.comm_exposed_s
    if before and row.step_s:  # both are a fixed amount of work over the step
        scale = before / row.step_s
        row.tokens_per_s = row.tokens_per_s * scale if row.tokens_per_s else None
        row.mfu = row.mfu * scale if row.mfu else None
