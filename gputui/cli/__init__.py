"""The command line's entry point: ``gputui`` (the app), the ``strategies`` and ``presets``
listings, and the parser, built from one module per command family in this package (run,
devices, compare, sweep, predict, verify, bench_comm, resume; what they share is in
``common``, their tables in ``output``).

Exit status: 0 finished, 1 run failed, 2 bad input (one line on stderr, no traceback), 128 +
the signal's number when a signal stopped the run (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
Nothing here imports torch; training runs in a spawned child process.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any


def _loading_interrupted(signum, frame):
    raise SystemExit(128 + signum)


# A Ctrl-C while the command line loads (its imports take a moment) ends the command quietly
# with 130, as after it; the previous handler is back once this module has loaded.
_LOADING = threading.current_thread() is threading.main_thread()
_previous = signal.signal(signal.SIGINT, _loading_interrupted) if _LOADING else None

from gputui import __version__  # noqa: E402
from gputui.cli.common import EXIT_INTERRUPTED, EXIT_OK, Parser, fail  # noqa: E402
from gputui.cli.run import add_run_parser, cmd_run, resolve_config  # noqa: E402,F401
from gputui.core.config import ConfigError  # noqa: E402
from gputui.core.errors import UserError, describe  # noqa: E402

# ------------------------------------------------------------------ listings
def cmd_strategies(args) -> int:
    """``gputui strategies``: every strategy, its description, and whether it can run."""
    from gputui.core import registry
    from gputui.core.config import RunConfig, apply_overrides
    from gputui.core.devices import DeviceSpecError
    from gputui.hw.discovery import resolve_devices
    from gputui.plan import caveat, why_not

    try:
        cfg = apply_overrides(RunConfig(), [("--devices", "devices.spec", args.devices)])
        devices = resolve_devices(args.devices)
    except (ConfigError, DeviceSpecError) as exc:
        return fail(f"--devices: {exc}")
    rows: list[dict[str, Any]] = []
    for info in registry.all_infos():
        trial = apply_overrides(cfg, [("strategy", "strategy.name", info.name)])
        reason = why_not(trial, devices)
        rows.append({"name": info.name, "description": info.description,
                     "multiprocess": info.multiprocess, "available": reason is None,
                     "reason": reason or "",
                     "caveat": (caveat(trial, devices) or "") if reason is None else ""})
    if args.json:
        print(json.dumps({"devices": [d.name for d in devices], "strategies": rows}, indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"strategies on {', '.join(d.name for d in devices)}")
    for col in ("name", "can run", "description"):
        table.add_column(col)
    for r in rows:
        can = (f"yes, {r['caveat']}" if r["caveat"] else "yes") if r["available"] \
            else f"no: {r['reason']}"
        table.add_row(r["name"], can, r["description"])
    Console().print(table)
    return EXIT_OK


def cmd_presets(args) -> int:
    """``gputui presets``: the preset files found, each with its whole description; a preset
    that cannot be loaded is listed with the reason, and the others still are."""
    from gputui.core.presets import list_presets, names_code, preset_description, preset_problem

    presets = []
    for p in list_presets():
        problem = preset_problem(p)
        try:
            lines = preset_description(p) if problem is None else []
        except (OSError, UnicodeDecodeError):  # changed since preset_problem looked
            lines = []
        presets.append((p, lines, names_code(p) if problem is None else [], problem))
    if args.json:
        print(json.dumps([{"name": p.stem, "path": str(p), "description": "\n".join(lines),
                           "runs_code": code, "problem": problem or ""}
                          for p, lines, code, problem in presets], indent=2))
        return EXIT_OK
    for p, lines, code, problem in presets:
        if problem is not None:
            print(f"{p.stem:24} [cannot be loaded: {problem}]")
            continue
        lines = lines or [""]
        mark = f"  [runs your code: {'; '.join(code)}]" if code else ""
        print(f"{p.stem:24} {lines[0]}{mark}".rstrip())
        for line in lines[1:]:
            print(f"{'':24} {line}".rstrip())
    return EXIT_OK


def cmd_tui(args) -> int:
    """``gputui``: the app."""
    from gputui.tui.app import run_tui
    from gputui.tui.lifecycle import leave

    leave(run_tui(preset=args.preset, runs_dir=args.runs_dir))  # the quit: no module teardown


def _global_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", help="open the app with this preset loaded")
    parser.add_argument("--runs-dir", dest="global_runs_dir", metavar="RUNS_DIR",
                        help="where run records go, for the app and every command "
                             "(default ./runs or $GPUTUI_RUNS_DIR)")
    parser.set_defaults(func=cmd_tui, command=None)


def app_args(argv: list[str]) -> argparse.Namespace | None:
    """``gputui`` with no command (only --preset and --runs-dir): the app's arguments, read
    without building the whole parser, whose command families' imports would delay the app's
    first paint by a tenth of a second; None for anything else (a command, --help, a typo)."""
    if any(a in ("-h", "--help", "--version") for a in argv):
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    _global_flags(parser)
    try:
        args, rest = parser.parse_known_args(argv)
    except argparse.ArgumentError:  # a flag without its value: the whole parser says so
        return None
    return None if rest else args


def build_parser() -> Parser:
    parser = Parser(prog="gputui", description="A terminal experiment runner for multi-GPU "
                    "training. With no command, opens the app.")
    parser.add_argument("--version", action="version", version=f"gputui {__version__}")
    _global_flags(parser)
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    add_run_parser(sub)
    p = sub.add_parser("strategies", help="list the strategies and whether they can run",
                       description="Every parallelism strategy, what it does, and whether it "
                                   "can run on the given devices (with the reason when not).")
    p.add_argument("--devices", default="cpu*2", help="device choice to check against")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_strategies)
    p = sub.add_parser("presets", help="list the presets and what each one runs",
                       description="The preset files found in ./presets and in gputui's own "
                                   "presets/ folder, each with its whole description (the "
                                   "comment lines at its top). `gputui run NAME` runs one.")
    p.add_argument("--json", action="store_true",
                   help="print names, paths and descriptions as JSON")
    p.set_defaults(func=cmd_presets)
    from gputui.cli import bench_comm, compare, devices, predict, resume, sweep, tune, verify

    # compare registers `runs` and `compare`; the order is the order of `gputui --help`
    for family in (devices, compare, sweep, predict, tune, verify, bench_comm, resume):
        family.register(sub)
    return parser


# flags naming a file or folder: given empty, each would silently mean "not given"
PATH_FLAGS = {"runs_dir": "--runs-dir", "global_runs_dir": "--runs-dir", "export": "--export",
              "plots": "--plots", "tensorboard": "--tensorboard", "output": "--output"}


def empty_path_flag(args: argparse.Namespace) -> str | None:
    """One line for a path flag given an empty value, or None."""
    for dest, flag in PATH_FLAGS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            return f"{flag}: give a path (an empty one names nothing; leave the flag out for " \
                   f"its default)"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gputui`` console script."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = app_args(argv) or build_parser().parse_args(argv)
    except KeyboardInterrupt:  # the parser imports every command family
        return EXIT_INTERRUPTED
    # `gputui --runs-dir X COMMAND`: the global flag holds unless the command has its own
    if getattr(args, "runs_dir", None) is None:
        args.runs_dir = args.global_runs_dir
    empty = empty_path_flag(args)
    if empty:
        return fail(empty)
    try:
        return args.func(args)
    except UserError as exc:  # bad input found wherever: its one line, exit 2
        return fail(describe(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if _LOADING:
    signal.signal(signal.SIGINT, _previous)
