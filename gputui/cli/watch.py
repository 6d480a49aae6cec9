"""``gputui watch RUN``: follow a run started elsewhere (another terminal, a SLURM job, another
node sharing the runs folder) from its record, printed as ``gputui run`` prints its own, until
it ends. Read-only: nothing is written to the record (``gputui.runs.follow``).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from dataclasses import replace
from typing import Iterator

from gputui.cli.common import EXIT_FAILED
from gputui.core.config import ConfigError
from gputui.core.signals import Interrupted, nohup


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `watch` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "watch", help="follow a run started elsewhere, from its record, until it ends",
        description="Print a run's progress as `gputui run` does, read from its record as it "
                    "grows: a run started in another terminal, by SLURM, or on another node "
                    "whose runs folder is shared. Read-only. Ends when the run ends, or when "
                    "its writer is gone without ending it. Exit 0 when the run finished, 1 "
                    "otherwise.")
    p.add_argument("run", help="a run id from `gputui runs` (or any unique part of it), or a "
                               "run folder")
    p.add_argument("--runs-dir", help="where to look for RUN (default ./runs or "
                                      "$GPUTUI_RUNS_DIR)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress output: only the end, the summary line and the record")
    p.set_defaults(func=cmd_watch)
    return p


@contextlib.contextmanager
def _stop_signals_end_the_watch() -> Iterator[None]:
    """SIGTERM and SIGHUP end the watch as Ctrl-C does (raised as ``Interrupted``: 128 + the
    signal), not the process mid-line; the handlers before it are back after it (main thread
    only: elsewhere the signals are not the watch's)."""
    def end(signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:  # the terminal is gone: the last line has nowhere to go
            from gputui.core.signals import detach_output

            detach_output()
        raise Interrupted(signum)

    before = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if not nohup(sig):  # nohup's SIGHUP stays ignored
                before[sig] = signal.signal(sig, end)
    except ValueError:
        pass
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow the run until it ends; exit 0 when it finished."""
    from gputui.cli.printer import Printer, shown_path
    from gputui.cli.resume import run_folder
    from gputui.core.runstore import is_run_folder
    from gputui.runs.runlock import LOCK_NAME
    from gputui.runs.follow import RecordFollower
    from gputui.runs.history import run_state

    folder = run_folder(args.run, args.runs_dir)  # ConfigError: main's one line, exit 2
    if not (is_run_folder(folder) or (folder / LOCK_NAME).exists()):
        raise ConfigError(f"{shown_path(folder)} is not a run's record (none of its files, "
                          f"events.jsonl, config.toml, summary.json, ..., nor its lock); give "
                          f"a run id from `gputui runs` or a run's folder")
    follower = RecordFollower(folder)
    printer = Printer(stream=sys.stdout, quiet=args.quiet)
    try:
        with _stop_signals_end_the_watch():  # before the first line, which says it watches
            printer.line(f"watching {shown_path(folder)}: {follower.started_here()}; "
                         f"read-only", always=True)
            while not follower.done:
                for ev in follower.poll(timeout=0.25):
                    if follower.gone and ev is follower.terminal:
                        continue  # the watcher's own end, said once below: not a failure
                    printer.handle(ev)
                for sample in follower.samples():
                    printer.handle(sample)
    except (KeyboardInterrupt, Interrupted) as exc:
        printer.line("stopped watching (the run goes on where it runs)", always=True)
        return exc.exit_code if isinstance(exc, Interrupted) else 130
    summary, status = run_state(folder)
    if follower.gone:
        summary, status = replace(summary, reason=follower.gone), "incomplete"
    printer.line(f"ended: {status}" + (f" ({summary.reason})" if summary.reason else ""),
                 always=True)
    printer.summary(summary, status=status, run_dir=folder)
    return EXIT_FAILED if follower.gone else follower.status.exit_code
