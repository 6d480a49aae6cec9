"""gputui under SLURM: what a job step's ``SLURM_*`` variables say (the node count, this
node's rank, the first node, a port), checked against the preset before anything starts.

``srun gputui run PRESET`` starts one gputui per task. Two shapes are understood:

- one task per node (torchtitan's sbatch pattern, the usual one): each task is a node of the
  run, and its elastic agent starts one rank per device of the node. nnodes = the step's node
  count, node_rank = ``SLURM_NODEID``;
- one task per device (``--ntasks-per-node`` = the GPUs of a node, Lightning's pattern): each
  task is a "node" of one rank on its own device. nnodes = the step's task count, node_rank
  = ``SLURM_PROCID``.

Both rendezvous at the step's first host (the first name of ``SLURM_STEP_NODELIST``), on a port
made from the job and step ids, with a rendezvous id of the job and step, so two steps of one
job never join each other. A step whose tasks are spread unevenly over its nodes (``--ntasks``
without ``--ntasks-per-node``: Lightning #20391) or that does not fit the preset is refused in
one line. Only a job step (``srun``) counts: a batch script's own shell has no
``SLURM_STEP_ID``. ``GPUTUI_NO_SLURM=1`` ignores SLURM altogether. Pure and torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from gputui.core.errors import UserError

NO_SLURM = "GPUTUI_NO_SLURM"
PORT_BASE, PORT_SPAN = 15000, 10000  # the rendezvous port: 15000-24999, as Lightning's
NODES_FOLDER = "nodes"  # <runs>/nodes/node<k>: the records of the nodes other than the first


class SlurmMismatch(UserError, ValueError):
    """The job step's shape does not fit the preset; the message is one line with the fix."""


def hostnames(nodelist: str) -> list[str]:
    """The host names of a compact SLURM node list, in order, as ``scontrol show hostnames``
    gives them: "node[1-3,7],gpu-a[01-02]" -> node1, node2, node3, node7, gpu-a01, gpu-a02.
    A name may hold several bracket groups ("r[1-2]n[1-2]"). ValueError when it is not one."""
    names: list[str] = []
    for item in _split_top(nodelist.strip()):
        names.extend(_expand(item))
    if not names:
        raise ValueError(f"an empty node list: {nodelist!r}")
    return names


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"an unmatched ']' in the node list {text!r}")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"an unmatched '[' in the node list {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand(item: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    out: list[str] = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdecimal() or (hi and not hi.isdecimal()):
            raise ValueError(f"a range that is not numbers in the node list: [{ranges}]")
        width = len(lo)  # node[01-10]: the numbers keep their leading zeros
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(prefix + str(n).zfill(width) + tail for tail in _expand(rest))
    return out


def tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` as a list: "2(x3),1" -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"tasks per node {text!r} is not SLURM's form, e.g. 2(x3),1")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def port_for(job_id: int, step_id: int) -> int:
    """The rendezvous port of a job step: every task computes the same one, and steps of
    nearby jobs sharing a first node get different ones."""
    return PORT_BASE + (job_id + step_id) % PORT_SPAN


@dataclass(frozen=True)
class Step:
    """What a SLURM job step says about the task this process is."""

    job_id: int
    step_id: int
    hosts: tuple[str, ...]  # the step's nodes, in order (the first hosts the rendezvous)
    node_id: int  # SLURM_NODEID: this node's index among the step's nodes
    proc_id: int  # SLURM_PROCID: this task's global index
    local_id: int  # SLURM_LOCALID: this task's index on its node
    tasks: tuple[int, ...]  # tasks on each node
    restarts: int = 0  # SLURM_RESTART_COUNT: how often the job was requeued

    @property
    def per_node(self) -> int:
        """Tasks on each node (uneven steps are refused by :func:`check`)."""
        return self.tasks[0]

    @property
    def per_device(self) -> bool:
        """One task per device (several tasks on a node): each task is a node of one rank."""
        return self.per_node > 1

    @property
    def nnodes(self) -> int:
        """The run's nodes: the step's nodes, or its tasks when each task is one device."""
        return sum(self.tasks) if self.per_device else len(self.hosts)

    @property
    def node_rank(self) -> int:
        return self.proc_id if self.per_device else self.node_id

    @property
    def endpoint(self) -> str:
        return f"{self.hosts[0]}:{port_for(self.job_id, self.step_id)}"

    @property
    def rdzv_id(self) -> str:
        return f"slurm-{self.job_id}.{self.step_id}"


def from_env(env: Mapping[str, str]) -> Step | None:
    """The job step this process is a task of, or None outside one (no SLURM, a batch
    script's own shell, ``GPUTUI_NO_SLURM=1``). SlurmMismatch when SLURM's variables cannot
    be read (one line naming the variable)."""
    if env.get(NO_SLURM, "") not in ("", "0") or "SLURM_JOB_ID" not in env \
            or "SLURM_STEP_ID" not in env:
        return None

    def number(name: str, default: str | None = None) -> int:
        text = env.get(name, default)
        if text is None or not text.strip().isdecimal():
            raise SlurmMismatch(f"SLURM variable {name}={text!r} is not a number; run gputui "
                                f"as a task of srun, or set {NO_SLURM}=1 to ignore SLURM")
        return int(text)

    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    try:
        hosts = hostnames(nodelist)
        tasks = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                               or env.get("SLURM_TASKS_PER_NODE", "1"))
    except ValueError as exc:
        raise SlurmMismatch(f"cannot read SLURM's step: {exc}; set {NO_SLURM}=1 to ignore "
                            f"SLURM") from None
    return Step(job_id=number("SLURM_JOB_ID"), step_id=number("SLURM_STEP_ID"),
                hosts=tuple(hosts), node_id=number("SLURM_NODEID", "0"),
                proc_id=number("SLURM_PROCID", "0"), local_id=number("SLURM_LOCALID", "0"),
                tasks=tuple(tasks), restarts=number("SLURM_RESTART_COUNT", "0"))


def check(step: Step, multiprocess: bool, strategy: str, preset_nnodes: int,
          device_spec: str) -> None:
    """Refuse (SlurmMismatch, one line) a step that does not fit the preset, before anything
    starts: tasks spread unevenly, a one-process strategy on several tasks, a preset made for
    another node count, or one task per device with a preset that names another count."""
    if len(step.tasks) != len(step.hosts):
        raise SlurmMismatch(f"SLURM gave {len(step.hosts)} nodes but tasks for "
                            f"{len(step.tasks)}; run gputui under srun")
    if len(set(step.tasks)) > 1:
        spread = ",".join(str(t) for t in step.tasks)
        raise SlurmMismatch(
            f"SLURM spread the step's {sum(step.tasks)} tasks unevenly over its "
            f"{len(step.hosts)} nodes ({spread}): gputui needs the same number on each; ask "
            f"for --ntasks-per-node=N (1: one gputui per node, the usual; or the GPUs of a "
            f"node) instead of --ntasks")
    total = sum(step.tasks)
    if total > 1 and not multiprocess:
        raise SlurmMismatch(
            f"strategy '{strategy}' runs in one process, but this SLURM step has {total} "
            f"tasks on {len(step.hosts)} node(s); use a ddp, fsdp or mesh preset, or run "
            f"`srun -N1 -n1 gputui run ...`")
    if preset_nnodes > 1 and preset_nnodes != step.nnodes:
        shape = (f"{total} tasks (one per device)" if step.per_device
                 else f"{len(step.hosts)} nodes")
        raise SlurmMismatch(
            f"the preset's dist.nnodes = {preset_nnodes}, but this SLURM step has {shape}; "
            f"ask SLURM for {preset_nnodes} nodes (srun -N{preset_nnodes} "
            f"--ntasks-per-node=1) or set --set dist.nnodes={step.nnodes}")
    if step.per_device:
        count = device_count(device_spec)
        if count not in (None, step.per_node):
            fix = f"--ntasks-per-node={count}, or " if count > 1 else ""
            raise SlurmMismatch(
                f"SLURM started {step.per_node} tasks per node (one per device), but the "
                f"preset's devices.spec '{device_spec}' names {count} per node; ask for "
                f"{fix}--ntasks-per-node=1 (one gputui per node starts a rank on each of its "
                f"devices)")


def device_count(spec: str) -> int | None:
    """How many devices a spec names, where the spec alone says (None: "all", "cuda:*")."""
    text = spec.strip().lower()
    m = re.fullmatch(r"cpu(?:\*(\d+))?", text)
    if m:
        return int(m.group(1) or 1)
    if text.isdecimal() and int(text) > 0:
        return int(text)
    parts = [p for p in text.split(",") if p.strip()]
    if parts and all(re.fullmatch(r"\s*(cuda:|gpu:)?\d+\s*", p) for p in parts):
        return len(parts)
    return None


def task_devices(step: Step, device_spec: str, env: Mapping[str, str]) -> str:
    """The device spec of one task when each task is one device: CPU presets keep one CPU
    rank; GPU presets take the task's own GPU (GPU 0 when SLURM bound the task to one GPU
    through CUDA_VISIBLE_DEVICES, else the GPU numbered by SLURM_LOCALID)."""
    if device_spec.strip().lower().startswith("cpu"):
        return "cpu"
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return "0," if len(visible) == 1 else f"{step.local_id},"


def overrides(step: Step, device_spec: str, env: Mapping[str, str]) -> list[tuple[str, Any]]:
    """The config keys the step sets: (key, value). A step of one task keeps the run's own
    free local port (nothing to meet)."""
    keys: list[tuple[str, Any]] = [("dist.nnodes", step.nnodes),
                                   ("dist.node_rank", step.node_rank)]
    if step.nnodes > 1:
        keys += [("dist.rdzv_endpoint", step.endpoint), ("dist.rdzv_id", step.rdzv_id)]
    if step.per_device:
        keys.append(("devices.spec", task_devices(step, device_spec, env)))
    return keys


def describe(step: Step) -> str:
    """The one line that says what gputui took from SLURM."""
    shape = ("one task per device: this task is one rank" if step.per_device
             else "one task per node: this node's ranks are its devices")
    again = f", requeued {step.restarts}x" if step.restarts else ""
    if step.nnodes == 1:
        return (f"SLURM job {step.job_id} step {step.step_id}{again}: one task on "
                f"{step.hosts[0]}: this node's ranks are its devices")
    return (f"SLURM job {step.job_id} step {step.step_id}{again}: node {step.node_rank} of "
            f"{step.nnodes} ({step.hosts[step.node_id]}), rendezvous at {step.endpoint} "
            f"(id {step.rdzv_id}); {shape}")


def follower(env: Mapping[str, str]) -> bool:
    """This process is a task of a SLURM step other than the first node's: it records beside
    the first node's run (``<runs>/nodes/``) and leaves the run folder it resumes to the
    first node (which holds its lock)."""
    try:
        step = from_env(env)
    except SlurmMismatch:
        return False
    return step is not None and step.node_rank > 0


def check_gpus(step: Step, cuda_devices: int, env: Mapping[str, str]) -> None:
    """One task per node: the GPUs the preset chose on this node fit what SLURM gave it
    (``SLURM_GPUS_ON_NODE``, set when the job asked for GPUs). SlurmMismatch otherwise."""
    given = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if step.per_device or not cuda_devices or not given.isdecimal():
        return
    if cuda_devices > int(given):
        raise SlurmMismatch(
            f"the preset runs on {cuda_devices} GPUs per node, but SLURM gave this node "
            f"{given} (SLURM_GPUS_ON_NODE); ask for --gpus-per-node={cuda_devices}, or set "
            f"devices.spec = {given}")


REQUEUE_EXIT = 128 + 10  # gputui's exit after a SIGUSR1 stop: the batch script requeues
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")


def time_problem(text: str) -> str | None:
    """None when ``text`` is one of SLURM's time-limit forms (minutes, MM:SS, HH:MM:SS,
    D-HH, D-HH:MM, D-HH:MM:SS), else the one line that says so."""
    if _TIME.fullmatch(text.strip()):
        return None
    return (f"--time {text!r} is not a SLURM time limit; give minutes (90), HH:MM:SS "
            f"(01:30:00) or D-HH:MM:SS (1-00:00:00)")


def sbatch_script(preset: str, run_name: str, nodes: int, gpus_per_node: int, gputui: str,
                  runs_dir: str, sets: list[str], time: str = "", partition: str = "",
                  output: str = "gputui-%j.out", signal_s: int = 120) -> str:
    """An sbatch script a person can read and submit: one gputui per node (each starts one
    rank per device of its node), SIGUSR1 ``signal_s`` before the time limit (the graceful
    stop with a checkpoint), and a requeue that resumes the run from it."""
    sets_text = "".join(f" --set {_quote(s)}" for s in sets)
    opt = [("job-name", f"gputui-{run_name}", "the name squeue shows"),
           ("nodes", str(nodes), "the run's nodes (dist.nnodes; SLURM_NODEID is each one's "
                                 "dist.node_rank)"),
           ("ntasks-per-node", "1", "one gputui per node: it starts one rank per device of "
                                    "its node")]
    if gpus_per_node:
        opt.append(("gpus-per-node", str(gpus_per_node), "the GPUs of each node: the "
                                                          "preset's devices"))
    if time:
        opt.append(("time", time, "the time limit"))
    if partition:
        opt.append(("partition", partition, "the partition (queue) to run in"))
    opt += [("signal", f"USR1@{signal_s}", f"SIGUSR1 to every gputui process {signal_s} s "
                                          f"before the time limit: it checkpoints and stops"),
            ("requeue", "", "a job stopped by that signal may go back in the queue (below)"),
            ("open-mode", "append", "a requeued job adds to its output file"),
            ("output", output, "stdout and stderr of the job (%j: the job id)")]
    width = max(len(f"#SBATCH --{k}" + (f"={v}" if v else "")) for k, v, _ in opt) + 2
    lines = ["#!/bin/bash",
             f"# gputui: the preset {preset} on {nodes} node(s)"
             + (f" of {gpus_per_node} GPU(s)" if gpus_per_node else " (CPU ranks)")
             + ", written by `gputui slurm`.",
             "# Submit it with `sbatch FILE`; docs/clusters.md tells what each line does."]
    for key, value, why in opt:
        text = f"#SBATCH --{key}" + (f"={value}" if value else "")
        lines.append(f"{text.ljust(width)}# {why}")
    lines += [
        "",
        "# The runs folder: on a file system every node sees (the first node writes the run's",
        "# record there, the other nodes theirs under nodes/; a resume reads its checkpoint).",
        f"export GPUTUI_RUNS_DIR={_quote(runs_dir)}",
        "# The gputui this script was written with (the same path on every node).",
        f"GPUTUI={_quote(gputui)}",
        "",
        "# Each task reads SLURM's variables: the node count, its node rank (SLURM_NODEID), the",
        "# first node of SLURM_JOB_NODELIST (it hosts the rendezvous) and a port made from",
        "# SLURM_JOB_ID, and says what it took in the output's first lines.",
        "# A requeued job keeps its job id: it resumes the newest run of this job (whose id",
        "# holds slurm$SLURM_JOB_ID) from that run's checkpoint instead of starting again.",
        'last=$(ls -d "$GPUTUI_RUNS_DIR"/*-slurm"$SLURM_JOB_ID"-* 2>/dev/null | tail -n 1)',
        'if [ -n "$last" ]; then',
        '    srun $GPUTUI resume "$last"',
        "else",
        f"    srun $GPUTUI run {_quote(preset)}{sets_text}",
        "fi",
        "rc=$?",
        f"# {REQUEUE_EXIT} = 128 + SIGUSR1: the time limit's warning stopped the run at a "
        "checkpoint:",
        "# queue the job again (it resumes above). Any other end is the job's end.",
        f'if [ "$rc" -eq {REQUEUE_EXIT} ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$rc"',
        ""]
    return "\n".join(lines)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
