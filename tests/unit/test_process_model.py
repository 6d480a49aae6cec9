"""The process model's seams: the typed hand-off crosses spawn whole, the stop channel carries
the parent's reason, a rank's identity comes from one constructor, the record has one writer,
and child code never imports the parent's."""

from __future__ import annotations

import multiprocessing as mp
import re
import sys
from dataclasses import replace
from pathlib import Path

from test_import_graph import package_graph

from gputui.core.config import RunConfig
from gputui.core.devices import Device, cpu_devices
from gputui.core.events import LogLine, RunStopped, Status
from gputui.core.runstore import read_events, read_summary
from gputui.core import recorder
from gputui.core.handoff import LaunchSpec, StopChannel
from gputui.train.rankinfo import RankInfo

PACKAGE = Path(__file__).resolve().parents[2] / "gputui"


def _child(spec: LaunchSpec) -> None:
    """A spawned child: report what arrived and what it had to import, then ask the stop."""
    import gputui.train.rankinfo  # noqa: F401 - the child side's torch-free leaves
    import gputui.core.recorder  # noqa: F401
    import gputui.train.stopping as stopping

    flag = stopping.RunStop(spec.stop)
    before = flag()
    spec.stop.ask("asked by the child")
    spec.stop.ask("a second reason is not kept")
    plain = replace(spec, queue=None, stop=None)  # a queue is passed on only at a spawn
    spec.queue.put((plain, before, flag(), flag.reason, "torch" in sys.modules))


def test_a_launch_spec_crosses_spawn_whole_with_its_channels(tmp_path):
    ctx = mp.get_context("spawn")
    spec = LaunchSpec(config=RunConfig().replace(run={"epochs": 1}),
                      devices=tuple(cpu_devices(2)),
                      run_id="r", run_dir=str(tmp_path), parent_pid=1, t_launch=12.5,
                      notes=("no GPU: ran on the CPU",), queue=ctx.Queue(),
                      stop=StopChannel.create(ctx), data_file="/dev/shm/x")
    proc = ctx.Process(target=_child, args=(spec,))
    proc.start()
    got, before, after, reason, torch_loaded = spec.queue.get(timeout=60)
    proc.join(30)
    assert proc.exitcode == 0
    assert isinstance(got.config, RunConfig)  # the typed config itself, never a dict
    assert (got.config, got.run_id, got.run_dir, got.t_launch, got.notes, got.data_file) == (
        spec.config, spec.run_id, spec.run_dir, spec.t_launch, spec.notes, spec.data_file)
    assert got.devices == spec.devices and isinstance(got.devices[0], Device)
    assert (before, after, reason) == (False, True, "asked by the child")
    # the child's ask reached the parent's side of the same channel
    assert spec.stop.asked() and spec.stop.reason() == "asked by the child"
    assert not torch_loaded  # the hand-off and the stop path load no torch


def test_a_rank_identity_comes_from_torch_elastic_or_from_what_the_caller_gives():
    elastic = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
               "GROUP_RANK": "1"}
    assert RankInfo.of_process(2, env=elastic) == RankInfo(3, 1, 4, 2, 1)
    # a test that starts its own processes: rank and world size given, 2 devices per node
    assert RankInfo.of_process(2, rank=3, world_size=4, env={}) == RankInfo(3, 1, 4, 2, 1)


def test_the_record_writer_ends_a_record_once_and_knows_it(tmp_path):
    forwarded = []
    rec = recorder.Recorder(tmp_path, forward=forwarded.append)
    rec.emit(LogLine(level="info", message="note"))
    assert not rec.started and rec.terminal is None
    rec.emit(RunStopped(reason="stopped by user"))
    rec.emit(RunStopped(reason="a second end is not written"))
    rec.close()
    assert rec.ended and rec.terminal.reason == "stopped by user"
    assert [e.kind for e in read_events(tmp_path)] == ["log", "run_stopped"]
    assert read_summary(tmp_path).reason == "stopped by user"
    assert [e.kind for e in forwarded] == ["log", "run_stopped"]


def test_the_parent_fallback_ends_a_dead_hosts_record_and_closes_it(tmp_path):
    rec = recorder.Recorder(tmp_path)
    rec.emit(LogLine(level="info", message="note"))
    rec.log.close()  # the host died here
    assert recorder.end_after_host(tmp_path, RunStopped(reason="killed", killed=True))
    assert [e.kind for e in read_events(tmp_path)] == ["log", "run_stopped"]
    assert read_summary(tmp_path).status is Status.KILLED


_WRITES_RECORD = re.compile(
    r"(EventLog|AppendLog|open|write_atomic|write_with)\([^)]*"
    r"(events\.jsonl|summary\.json|EVENTS_FILE|SUMMARY_FILE)")


def test_the_record_has_one_writer():
    """Only recorder.py opens events.jsonl or writes summary.json (a structural guard)."""
    writers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if _WRITES_RECORD.search(p.read_text(encoding="utf-8"))
                     or "def write_summary" in p.read_text(encoding="utf-8"))
    assert writers == ["core/recorder.py"]


CHILD = ["gputui.train.host", "gputui.train.worker", "gputui.train.agent", "gputui.train.ranks",
         "gputui.train.stopping", "gputui.core.recorder", "gputui.train.rankinfo",
         "gputui.core.handoff"]
PARENT = ("gputui.runs.launcher", "gputui.runs.warm", "gputui.runs.sweep.runner", "gputui.cli",
          "gputui.tui")


def test_no_run_process_reads_the_record_back():
    """The host knows what it wrote: nothing on the child side reads events.jsonl to decide
    what to do next (a structural guard)."""
    child = [*(PACKAGE / "train").rglob("*.py"), PACKAGE / "core" / "recorder.py"]
    readers = sorted(str(p.relative_to(PACKAGE)) for p in child
                     if re.search(r"read_events|read_summary|EVENTS_FILE",
                                  p.read_text(encoding="utf-8")))
    # the recorder's own fallback, used by the parent once the host is gone
    assert readers == ["core/recorder.py"]


def test_one_entry_point_starts_every_run_process():
    """The run host is the only process a run starts (its ranks are torch elastic's
    entrypoint, inside the host). Every other child measures and records nothing, and starts
    the one way (``proctree.ask_children``: deadline, stop, the tree killed): the check before
    a start that builds and cuts a user's model (runs/model_check.py), the communication
    measurements of bench-comm and predict (runs/comm_bench.py), the plan's tracer and the
    ranks that measure its error (runs/forecast/tracing.py and measure.py)."""
    text = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    spawned = sorted({m for p, src in text.items() if p.name != "proctree.py"
                      for m in re.findall(r"Process\([^)]*target=(\w+)", src)})
    assert spawned == ["host_main"]
    asked = sorted({m for src in text.values()
                    for m in re.findall(r"ask_children\(\s*\[\s*\((\w+),", src)})
    assert asked == ["check_main", "comm_main", "measure_main", "trace_main"]


def test_child_code_never_imports_the_parent():
    graph = package_graph()
    for start in CHILD:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        bad = sorted(m for m in seen if m.startswith(PARENT))
        assert not bad, f"{start} imports parent code: {bad}"
