"""``gputui slurm PRESET --nodes N --gpus-per-node G``: write an sbatch script that runs the
preset on a SLURM cluster (one gputui per node under ``srun``; ``gputui.core.slurm`` tells how
each task reads SLURM's variables). The preset is checked against the shape asked for before
anything is written. Never imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gputui.cli.common import EXIT_OK, fail


def register(sub) -> None:
    """Add the `slurm` subcommand."""
    p = sub.add_parser("slurm", help="write an sbatch script that runs a preset on SLURM",
                       description="Write a readable sbatch script (a comment on each line) "
                                   "that runs the preset on N nodes with one gputui per node, "
                                   "checkpoints and stops on SLURM's warning before the time "
                                   "limit, and requeues to resume. See docs/clusters.md.")
    p.add_argument("preset", help="a preset file, or a name from `gputui presets`")
    p.add_argument("--nodes", type=int, required=True, help="nodes of the run (dist.nnodes)")
    p.add_argument("--gpus-per-node", type=int, required=True,
                   help="GPUs of each node (0: CPU ranks, the preset's devices.spec)")
    p.add_argument("--time", help="time limit, e.g. 90 (minutes) or 1-00:00:00 (default: "
                                  "the partition's)")
    p.add_argument("--partition", help="the partition (queue) to submit to (default: the "
                                       "cluster's)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a preset key in the script's run (repeatable)")
    p.add_argument("--runs-dir", help="the runs folder, shared by every node (default ./runs "
                                      "or $GPUTUI_RUNS_DIR, made absolute)")
    p.add_argument("--signal-before", type=int, default=120, metavar="SECONDS",
                   help="send SIGUSR1 this long before the time limit (the checkpoint's time)")
    p.add_argument("--job-output", default="gputui-%j.out", metavar="FILE",
                   help="the job's output file (%%j: the job id)")
    p.add_argument("--output", help="write the script here (default: print it)")
    p.set_defaults(func=cmd_slurm)


def cmd_slurm(args: argparse.Namespace) -> int:
    """``gputui slurm``: check the preset against the shape, then write the script."""
    from gputui.core import registry, slurm
    from gputui.core.config import load_preset, parse_assignment
    from gputui.core.presets import resolve_preset
    from gputui.core.runstore import default_runs_dir

    if args.nodes < 1 or args.gpus_per_node < 0:
        return fail(f"--nodes {args.nodes} --gpus-per-node {args.gpus_per_node}: give at least "
                    f"one node and zero or more GPUs per node")
    if args.signal_before < 1:
        return fail(f"--signal-before {args.signal_before}: give the seconds before the time "
                    f"limit (at least 1)")
    problem = slurm.time_problem(args.time) if args.time else None
    if problem:
        return fail(problem)
    path = resolve_preset(args.preset)
    overrides = []
    for text in args.sets:
        key, value = parse_assignment(text)
        overrides.append((f"--set {text}", key, value))
    cfg = load_preset(path, overrides)  # a ConfigError is main's one line, exit 2
    info = registry.get(cfg.strategy.name)
    shape = slurm.Step(job_id=0, step_id=0, hosts=tuple(f"n{i}" for i in range(args.nodes)),
                       node_id=0, proc_id=0, local_id=0, tasks=(1,) * args.nodes)
    slurm.check(shape, bool(info and info.multiprocess), cfg.strategy.name, cfg.dist.nnodes,
                cfg.devices.spec)
    named = slurm.device_count(cfg.devices.spec)
    is_cpu = cfg.devices.spec.strip().lower().startswith("cpu")
    if args.gpus_per_node and (is_cpu or named not in (None, args.gpus_per_node)):
        return fail(f"--gpus-per-node {args.gpus_per_node}, but the preset's devices.spec is "
                    f"'{cfg.devices.spec}'; add --set devices.spec=all (each node's GPUs)")
    if not args.gpus_per_node and not is_cpu and cfg.devices.fallback != "cpu":
        return fail(f"--gpus-per-node 0 runs CPU ranks, but the preset's devices.spec is "
                    f"'{cfg.devices.spec}'; add --set devices.spec=cpu or ask for GPUs")
    runs_dir = Path(args.runs_dir or default_runs_dir()).absolute()
    text = slurm.sbatch_script(
        str(path.resolve()) if path.exists() else args.preset, cfg.run.name, args.nodes,
        args.gpus_per_node, f"{sys.executable} -m gputui", str(runs_dir), args.sets,
        args.time or "", args.partition or "", args.job_output, args.signal_before)
    if not args.output:
        print(text, end="")
        return EXIT_OK
    problem = write_script(Path(args.output), text)
    if problem:
        return fail(problem)
    print(f"wrote {args.output}: submit it with `sbatch {args.output}`")
    return EXIT_OK


def write_script(path: Path, text: str) -> str:
    """Write an sbatch script, executable (`gputui slurm --output`, `gputui plan
    --write-sbatch`): '' when written, else the one line saying why not."""
    from gputui.core.filewrite import WriteFailed, write_atomic

    try:
        write_atomic(path, text)
        os.chmod(path, 0o755)
    except WriteFailed as exc:  # its text names the path: "cannot write PATH: why"
        return str(exc)
    except OSError as exc:
        return f"cannot make {path} executable ({exc.strerror or exc})"
    return ""
