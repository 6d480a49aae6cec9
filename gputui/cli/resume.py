"""`gputui resume RUN`: continue a stopped or crashed run from its checkpoint.

The resumed run gets a NEW run folder beside the old one (the old record stays exactly as it
ended). Its config is the old run's config.toml with ``run.resume_from`` set to the old folder,
so the new record says where it came from (in config.toml, in the run_started event, and in a
"resumed from ..." line). Training continues at the checkpoint's position: the same batches,
the same random states, so the final parameters equal those of an uninterrupted run.
Never imports torch (the training process does).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gputui.core import safeio
from gputui.core.config import ConfigError
from gputui.core.events import Status, plural
from gputui.core.runstore import CHECKPOINT_NAME
from gputui.runs import runlock



def register(subparsers) -> argparse.ArgumentParser:
    """Add the `resume` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "resume", help="continue a stopped or crashed run from its checkpoint",
        description="Continue a run from the checkpoint in its folder (written at each epoch "
                    "end, every run.checkpoint_every steps and on a stop), in a new run folder, "
                    "with the run's saved config.toml.")
    p.add_argument("run", help="a run id from `gputui runs` (or any unique part of it), or a "
                               "run folder")
    p.add_argument("--epochs", type=int,
                   help="train to this many epochs in total (to extend a finished run)")
    p.add_argument("--runs-dir", help="where to look for RUN and put the new record "
                                      "(default: the folder holding RUN)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true",
                   help="no progress output: only the summary line and the record's path")
    p.add_argument("--exclusive", action="store_true",
                   help="refuse to start when a chosen GPU is busy with another process")
    p.set_defaults(func=cmd_resume)
    return p


def run_folder(text: str, runs_dir: str | None = None) -> Path:
    """The folder to resume: any folder the path names (one that cannot be read is reported by
    the caller), else the run that ``history.find_run`` finds by id; ConfigError if none."""
    from gputui.runs.history import find_run

    if not text.strip():  # "" is the current folder to a path, and a prefix of every id
        raise ConfigError("an empty run id names no run; see `gputui runs` for the ids")
    path = Path(text).expanduser()
    if os.path.isdir(path):
        return path
    try:
        return find_run(text, runs_dir)
    except LookupError as exc:
        raise ConfigError(str(exc)) from None  # "no run ..." or "... is ambiguous: ..."


def resume_args(args: argparse.Namespace) -> argparse.Namespace:
    """The `gputui run` arguments that continue the run; raises ConfigError when it cannot."""
    from gputui.core.runstore import read_summary

    run_dir = run_folder(args.run, args.runs_dir).resolve()
    try:
        names = os.listdir(run_dir)
    except OSError as exc:
        raise ConfigError(f"{run_dir}: cannot read the run folder ({safeio.reason(exc)}); "
                          f"check its permissions") from None
    for name in ("config.toml", CHECKPOINT_NAME):
        if name in names:  # there but unreadable: say so, rather than "missing"
            try:
                os.close(safeio.open_regular(run_dir / name))
            except OSError as exc:
                why = str(exc) if isinstance(exc, safeio.Unreadable) else \
                    f"cannot read {name} ({safeio.reason(exc)})"
                raise ConfigError(f"{run_dir}: {why}") from None
    from gputui.core import slurm

    # a SLURM job's other nodes resume the first node's folder, whose lock that node holds
    active = None if slurm.follower(os.environ) else runlock.holder(run_dir)
    if active:
        raise ConfigError(f"{run_dir.name} is {active}; stop that run first (Ctrl-C in its "
                          f"terminal, or s in the app), then resume")
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"{run_dir}: no config.toml, so this is not a gputui run folder")
    if not (run_dir / CHECKPOINT_NAME).is_file():
        raise ConfigError(f"{run_dir.name}: no checkpoint ({CHECKPOINT_NAME}): the run ended "
                          f"before its first epoch or with run.checkpoint = false; start it "
                          f"again with `gputui run {run_dir / 'config.toml'}`")
    summary = read_summary(run_dir)
    done, planned = summary.epochs_done, summary.epochs or 0
    if summary.status is Status.FINISHED and (args.epochs is None or args.epochs <= done):
        raise ConfigError(f"{run_dir.name} already finished its {plural(planned, 'epoch')}; pass "
                          f"--epochs N with N > {done} to train it further")
    if args.epochs is not None and args.epochs <= done:
        raise ConfigError(f"--epochs {args.epochs}: the run already has "
                          f"{plural(done, 'epoch')} done; give a larger total")
    return argparse.Namespace(
        preset=str(run_dir / "config.toml"), resume_from=str(run_dir), sets=[],
        devices=None, strategy=None, epochs=args.epochs, batch_size=None, lr=None, seed=None,
        nnodes=None, node_rank=None, rdzv_endpoint=None,
        runs_dir=args.runs_dir or str(run_dir.parent), dry_run=False, json=args.json,
        quiet=args.quiet, exclusive=args.exclusive)


def cmd_resume(args: argparse.Namespace) -> int:
    """``gputui resume RUN``: the same as `gputui run` on the saved config, from the checkpoint.
    Exit status as for `gputui run` (0, 1 failed, 2 bad input, 130 interrupted)."""
    from gputui.cli.common import fail
    from gputui.cli.run import cmd_run

    try:
        run_args = resume_args(args)  # a ConfigError is main's one line, exit 2
    except OSError as exc:  # a record that changed under us: still one line
        return fail(f"{args.run}: cannot read the run ({safeio.reason(exc)})")
    return cmd_run(run_args)
