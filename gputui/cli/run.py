"""``gputui run PRESET``: train headless, print progress and a summary (also what ``gputui
resume`` runs). Nothing here imports torch; training runs in a spawned child process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gputui.cli.common import EXIT_OK, fail, runs_dir_problem
from gputui.core.events import Status
from gputui.core.filewrite import WriteFailed

SHORT_FLAGS = {  # flag dest -> config key
    "devices": "devices.spec", "strategy": "strategy.name", "epochs": "run.epochs",
    "batch_size": "optim.batch_size", "lr": "optim.lr", "seed": "run.seed",
    "nnodes": "dist.nnodes", "node_rank": "dist.node_rank", "rdzv_endpoint": "dist.rdzv_endpoint",
    "stall_after": "strategy.stall_after_s",
}


def add_run_parser(sub) -> None:
    """Add ``gputui run`` to an argparse subparsers object."""
    p = sub.add_parser("run", help="train from a preset, headless",
                       description="Train from a preset without the app: live progress on a "
                                   "terminal, plain lines otherwise, a record under the runs "
                                   "folder. Precedence: flags > --set > preset > defaults.")
    p.add_argument("preset", help="a preset file, or a name from `gputui presets`")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override any preset key, e.g. --set optim.lr=0.2 (repeatable)")
    p.add_argument("--devices", help="device choice: cpu, cpu*4, 0,2, all, 2, cuda:*")
    p.add_argument("--strategy", help="single, scratch, ...; see `gputui strategies`")
    p.add_argument("--epochs", type=int, help="passes over the training set (run.epochs)")
    p.add_argument("--batch-size", type=int, help="global batch size")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--seed", type=int,
                   help="seed of the parameter init and batch order (run.seed)")
    p.add_argument("--nnodes", type=int, help="multi-node ddp/fsdp: number of machines")
    p.add_argument("--node-rank", type=int, help="multi-node: this machine's rank")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="multi-node: c10d rendezvous")
    p.add_argument("--stall-after", type=float, metavar="SECONDS",
                   help="multi-process runs: when no rank's collectives move for this long, "
                        "name the rank that is behind and stop the run (strategy.stall_after_s;"
                        " default: 20 x the slowest logged step, at least 60 s; -1: never)")
    p.add_argument("--runs-dir", help="where run records go (default ./runs or $GPUTUI_RUNS_DIR)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("--json", action="store_true",
                   help="print the summary (or, with --dry-run, the config) as JSON on stdout")
    p.add_argument("--quiet", action="store_true",
                   help="no progress output: only the summary line and the record's path "
                        "(and a warning when the machine's load made its speed no baseline)")
    p.add_argument("--exclusive", action="store_true",
                   help="refuse to start when a chosen GPU is busy with another process")
    p.set_defaults(func=cmd_run)


def resolve_config(args) -> Any:
    """The preset, --set overrides and short flags, validated (``gputui.runs.prepare.Prepared``:
    the config and its devices, discovered once); raises ConfigError."""
    from gputui.core.config import parse_assignment
    from gputui.core.presets import resolve_preset
    from gputui.runs.prepare import load_checked

    resumed = getattr(args, "resume_from", None)  # `gputui resume`: the run's own config
    path = Path(args.preset) if resumed else resolve_preset(args.preset)
    overrides = [(f"gputui resume {Path(resumed).name}", "run.resume_from", resumed)] \
        if resumed else []
    for text in args.sets:
        key, value = parse_assignment(text)
        overrides.append((f"--set {text}", key, value))
    flags = []
    for dest, key in SHORT_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            flags.append((f"--{dest.replace('_', '-')}", key, value))
    # a task of a SLURM job step: its nodes, rank and rendezvous (flags still win)
    overrides += slurm_overrides(path, overrides + flags, "run config" if resumed else "preset")
    overrides += flags
    return load_checked(path, overrides, what="run config" if resumed else "preset")


def slurm_overrides(path: Path, overrides: list, what: str) -> list[tuple[str, str, Any]]:
    """The keys a SLURM job step sets (``gputui.core.slurm``), checked against the preset
    with its --set overrides; [] outside a step. SlurmMismatch: one line, exit 2."""
    import os

    from gputui.core import registry, slurm
    from gputui.core.config import load_preset

    step = slurm.from_env(os.environ)
    if step is None:
        return []
    base = load_preset(path, overrides, what)
    info = registry.get(base.strategy.name)
    slurm.check(step, bool(info and info.multiprocess), base.strategy.name, base.dist.nnodes,
                base.devices.spec)
    return [(f"SLURM job step {step.job_id}.{step.step_id}", key, value)
            for key, value in slurm.overrides(step, base.devices.spec, os.environ)]


def as_run(cfg) -> dict:
    """The config as the run uses it: a name a factory replaces (model.name under
    model.factory, data.name under data.factory) is left out, not shown as "lenet"."""
    d = cfg.to_dict()
    for table in ("model", "data"):
        if d[table].get("factory"):
            d[table].pop("name", None)
    return d


def cmd_run(args) -> int:
    """``gputui run PRESET``: train headless and print progress and a summary."""
    prepared = resolve_config(args)  # a ConfigError is main's one line, exit 2
    cfg = prepared.config
    from gputui.core.usercode import code_line

    code = code_line(cfg)
    if args.dry_run:  # shows the code a preset names; imports and runs none of it
        shown = as_run(cfg)
        if args.json:
            print(json.dumps(shown, indent=2), end="")
        else:
            import tomli_w

            print(f"# {code} (not run by --dry-run)\n" if code else "", end="")
            print(tomli_w.dumps(shown), end="")
        return EXIT_OK
    from gputui.cli.printer import Printer
    from gputui.core.runstore import read_summary
    from gputui.hw.discovery import busy_warnings
    from gputui.runs.launcher import launch

    # discovered once, in resolve_config: the warnings read the GPUs it saw
    devices, device_note, gpus = prepared.devices, prepared.note, prepared.gpus
    taken = busy_warnings([d for d in devices if d.kind == "cuda"], gpus) if args.exclusive \
        else []
    if taken:  # NVML sees another process on a chosen GPU
        return fail(f"--exclusive: {taken[0].split('; training')[0]}; choose free GPUs "
                    f"(see `gputui devices`) or drop --exclusive")
    import os

    from gputui.core import slurm

    step = slurm.from_env(os.environ)
    runs_dir = args.runs_dir
    if step is not None:
        slurm.check_gpus(step, sum(d.kind == "cuda" for d in devices), os.environ)
        if step.node_rank > 0:  # the first node's record is the job's; this node's beside it
            from gputui.core.runstore import default_runs_dir

            runs_dir = str(Path(runs_dir or default_runs_dir()) / slurm.NODES_FOLDER
                           / f"node{step.node_rank}")
    problem = runs_dir_problem(runs_dir)
    if problem:  # before any training: a record that cannot be written is lost work
        return fail(problem)
    # a SLURM job's other nodes print only their summary: the first node shows the progress
    printer = Printer(stream=sys.stderr if args.json else sys.stdout,
                      quiet=args.quiet or bool(step and step.node_rank > 0))
    # (the devices' fallback note is the run's own: printed with its notes as it starts)
    for warning in busy_warnings(devices, gpus):
        printer.line(f"warning: {warning}")
    if code:
        printer.line(code)
    if step is not None:
        printer.line(slurm.describe(step), always=True)
    # Ctrl-C, SIGTERM and SIGHUP: a graceful stop that keeps the record; a second one, or a
    # stop outlasting run.stop_grace_s, kills. The process-wide Supervisor (taken by main
    # first thing, so a signal during the imports above is not lost): every poll acts on it.
    from gputui.core import signals

    sup = signals.take_over(cfg.run.stop_grace_s)
    sup.grace_s = cfg.run.stop_grace_s
    sup.say = lambda text: _print(printer.line, text)
    try:
        handle = launch(cfg, runs_dir, devices, device_note,
                        follower=bool(step and step.node_rank > 0),
                        id_tag=f"slurm{step.job_id}" if step else "")
    except signals.Interrupted as exc:  # a signal before it: nothing was made
        from gputui.cli.common import interrupted

        return interrupted(exc.signum, "before the run started: nothing recorded")
    except OSError as exc:  # WriteFailed says which file and why in one line
        return fail(str(exc) if isinstance(exc, WriteFailed) else
                    f"cannot create the run folder ({exc})")
    while not handle.done:
        for ev in handle.poll(timeout=0.2):
            _print(printer.handle, ev)
        for sample in handle.samples():
            _print(printer.handle, sample)
    summary = read_summary(handle.run_dir)
    from gputui.core import machine, trust

    state = machine.read(handle.run_dir)  # what else ran meanwhile
    warning = trust.poisoned(state, noise=summary.steady.noise if summary.steady else None,
                             threads=summary.threads, omp_wait=summary.omp_wait)
    _print(lambda s: printer.summary(s, run_dir=handle.run_dir, baseline_warning=warning),
           summary)
    if args.json:  # the summary.json form, with where it is and what else ran meanwhile
        record = dict(summary.to_dict(), run_dir=str(handle.run_dir), machine=state,
                      baseline_warning=warning)
        _print(print, json.dumps(record, indent=2, sort_keys=True))
    if sup.first:  # the stop contract: 128 + the signal, and what was kept
        from gputui.cli.common import interrupted
        from gputui.core.runstore import CHECKPOINT_NAME

        status = handle.status
        kept = {Status.FINISHED: "the run had finished", Status.STOPPED: "the run stopped",
                Status.KILLED: "the run was killed"}.get(status, f"the run ended {status}")
        resumable = status is not Status.FINISHED and \
            (handle.run_dir / CHECKPOINT_NAME).is_file()
        again = f"srun gputui resume {handle.run_id}" if step else \
            f"gputui resume {handle.run_id}"
        if step is not None and step.node_rank > 0:
            again = "srun gputui resume RUN, RUN the first node's record"
        return interrupted(sup.first, f": {kept}; its record is kept in {handle.run_dir}"
                           + (f" (continue it: {again})" if resumable else ""))
    return handle.status.exit_code


def _print(write, item) -> None:
    """Progress output that cannot end the run: a terminal that hung up (EIO until SIGHUP
    arrives) or a closed pipe loses the output, never the record."""
    from gputui.core.signals import detach_output

    try:
        write(item)
    except OSError:
        detach_output()
