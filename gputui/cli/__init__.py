"""The command line's entry point: ``gputui`` (the app), the ``strategies`` and ``presets``
listings, and the parser, built from one module per command family in this package (run,
devices, compare, sweep, predict, verify, bench_comm, resume; what they share is in
``common``, their tables in ``output``).

Exit status: 0 finished, 1 run failed, 2 bad input (one line on stderr, no traceback), 128 +
the signal's number when a stop signal came (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), with one
line saying what was kept (the stop contract: docs/failures.md).
Nothing here imports torch; training runs in a spawned child process.
"""

from __future__ import annotations

import signal

_NOTED: list[int] = []  # stop signals that came while the command line loaded


def _loading_signal(signum, frame) -> None:
    if signum not in _NOTED:
        _NOTED.append(signum)


# The stop contract (docs/failures.md) holds from this module's first line: a stop signal
# while the command line loads (its imports take a moment) is noted, not raised, and main()
# acts on it (128 + the signal, one line) before anything starts. main() installs the
# process-wide Supervisor first thing; imported as a library, the previous handlers are back
# once this module has loaded.
_STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
try:
    # a hang-up `nohup` started the command to ignore stays ignored, here and in every process
    # it starts (gputui.core.signals.nohup, which reads GPUTUI_NOHUP)
    _NOHUP = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    if _NOHUP:
        import os as _os

        _os.environ["GPUTUI_NOHUP"] = "1"  # signals.NOHUP_ENV (not imported before this)
    _previous = {sig: signal.signal(sig, _loading_signal) for sig in _STOP
                 if not (sig == signal.SIGHUP and _NOHUP)}
    _LOADING = True
except ValueError:  # not the main thread: signals are not this import's to take
    _previous, _LOADING = {}, False

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

from gputui import __version__  # noqa: E402
from gputui.cli.common import EXIT_INTERRUPTED, EXIT_OK, Parser, fail, interrupted  # noqa: E402,F401
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

    from gputui.cli.common import set_overrides
    from gputui.core.config import load_preset
    from gputui.core.presets import resolve_preset
    from gputui.plan import mesh_choices

    try:
        sets = set_overrides(args.set)
        base = load_preset(resolve_preset(args.preset), sets) if args.preset else \
            apply_overrides(RunConfig(), sets)
    except ConfigError as exc:
        return fail(str(exc))
    try:
        cfg = apply_overrides(base, [("--devices", "devices.spec", args.devices)])
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
    meshes: list[dict[str, Any]] = []
    for m, reason in mesh_choices(cfg, devices):
        degrees = {"pp": m.pp, "dp_replicate": m.dp_replicate, "dp_shard": m.dp_shard,
                   "cp": m.cp, "tp": m.tp}
        if cfg.model.moe_experts:  # a mixture of experts: its expert-parallel degree too
            degrees["ep"] = m.ep
        meshes.append({"degrees": degrees, "mesh": m.describe(),
                       "data_parallel": m.data_parallel, "available": reason is None,
                       "reason": reason or ""})
    if args.json:
        print(json.dumps({"devices": [d.name for d in devices], "strategies": rows,
                          "meshes": meshes}, indent=2))
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
    console = Console()
    console.print(table)
    grid = Table(title=f"strategy 'mesh' on {len(devices) * cfg.dist.nnodes} ranks: "
                       f"--set parallel.pp=P --set parallel.dp_replicate=R "
                       f"--set parallel.dp_shard=S --set parallel.cp=C --set parallel.tp=T")
    dims = ("pp", "dp_replicate", "dp_shard", "cp", "tp") + (
        ("ep",) if cfg.model.moe_experts else ())
    for col in (*dims, "can run"):
        grid.add_column(col, justify="right" if col != "can run" else "left")
    for row in meshes:
        d = row["degrees"]
        grid.add_row(*(str(d[k]) for k in dims),
                     "yes" if row["available"] else f"no: {row['reason']}")
    console.print(grid)
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
    p.add_argument("--preset", default="",
                   help="check this preset's model and settings (default: the built-in "
                        "defaults, LeNet)")
    p.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a setting before checking (repeatable)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_strategies)
    p = sub.add_parser("presets", help="list the presets and what each one runs",
                       description="The preset files found in ./presets and in gputui's own "
                                   "presets/ folder, each with its whole description (the "
                                   "comment lines at its top). `gputui run NAME` runs one.")
    p.add_argument("--json", action="store_true",
                   help="print names, paths and descriptions as JSON")
    p.set_defaults(func=cmd_presets)
    from gputui.cli import (bench_comm, compare, devices, forecast, predict, resume, slurm,
                            sweep, tune, verify, watch)

    # compare registers `runs` and `compare`; the order is the order of `gputui --help`
    for family in (devices, compare, sweep, predict, forecast, tune, verify, bench_comm,
                   resume, watch, slurm):
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


# The commands that train or measure (the stop contract of docs/failures.md): a stop signal
# is noted, stops what runs, starts nothing more, and the command exits 128 + the signal with
# one line saying what was kept. The other commands end at once on Ctrl-C (130), as before.
TRAINING = {"run", "resume", "sweep", "verify", "tune", "predict", "bench-comm", "plan"}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gputui`` console script."""
    from gputui.core import signals

    own = threading.current_thread() is threading.main_thread()
    sup = signals.take_over(received=_NOTED) if own else None
    _NOTED.clear()
    try:
        return _main(argv, sup)
    finally:
        if sup is not None:
            sup.uninstall()


def _main(argv: list[str] | None, sup) -> int:
    import sys

    from gputui.core import signals

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = app_args(argv) or build_parser().parse_args(argv)
    except KeyboardInterrupt:  # the parser imports every command family
        return EXIT_INTERRUPTED
    if sup is not None and sup.first is not None:  # came while the command line loaded
        return interrupted(sup.first, "before anything started: nothing recorded")
    if sup is not None and args.command not in TRAINING:
        sup.uninstall()  # the app takes the signals itself; a listing ends at once
        # a signal that came as the handlers changed hands (nothing has started yet)
        came = list(sup.received)
        sup = None
        if args.command is None:  # the app: noted until its own handlers take over and act
            signals.hand_to_app(came + _NOTED)
        else:
            _unnoted()
            came += _NOTED
        _NOTED.clear()
        if came and args.command is not None:
            return interrupted(came[0], "before anything started: nothing recorded")
    # `gputui --runs-dir X COMMAND`: the global flag holds unless the command has its own
    if getattr(args, "runs_dir", None) is None:
        args.runs_dir = args.global_runs_dir
    empty = empty_path_flag(args)
    if empty:
        return fail(empty)
    try:
        code = args.func(args)
    except signals.Interrupted as exc:  # before the command's first run, or between runs
        return interrupted(exc.signum, "before its next run started: nothing more recorded")
    except UserError as exc:  # bad input found wherever: its one line, exit 2
        return fail(describe(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    first = sup.first if sup is not None else None
    if first is not None and code != 128 + first:  # came as the command ended its work
        return interrupted(first, "after its work was done: everything kept")
    return code


def _unnoted() -> None:
    """The stop signals as they were before this module loaded (Python's own: Ctrl-C raises
    KeyboardInterrupt, SIGTERM ends the process; or ignored, as nohup leaves SIGHUP) where the
    loading's noting handler is still in place: a command outside the stop contract, the
    Supervisor gone, would otherwise note every signal and act on none (`gputui watch` could
    be stopped by neither Ctrl-C nor SIGTERM)."""
    for sig, before in _previous.items():
        try:
            if signal.getsignal(sig) is _loading_signal:
                signal.signal(sig, before if before is not None else signal.SIG_DFL)
        except ValueError:  # not the main thread: not this call's to change
            return


def _entry_point() -> bool:
    """This import is the command line's own (the console script, ``python -m gputui``), not
    a library's, a test's or a spawned child's: its signal handling stays until main()."""
    import multiprocessing.process
    import os
    import sys

    if multiprocessing.process.parent_process() is not None:
        return False
    entry = sys.modules.get("__main__")
    spec = getattr(entry, "__spec__", None)
    if spec is not None and spec.name == "gputui.__main__":
        return True
    return os.path.basename(getattr(entry, "__file__", "") or "") == "gputui"


if _LOADING and not _entry_point():
    for _sig, _handler in _previous.items():
        signal.signal(_sig, _handler)
    if _NOTED:  # imported as a library: its own handling takes the signal, as it came
        _first = _NOTED[0]
        _NOTED.clear()
        os.kill(os.getpid(), _first)
