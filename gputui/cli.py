"""The command line: ``gputui`` (the app), ``gputui run PRESET``, ``strategies``, ``runs``,
``presets`` and ``devices``.

Exit status: 0 finished, 1 run failed, 2 bad input (one line on stderr, no traceback), 128 +
the signal's number when a signal stopped the run (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
Nothing here imports torch; training runs in a spawned child process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gputui import __version__
from gputui.config import ConfigError, load_preset
from gputui.cli_common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Parser, fail, runs_dir_problem
from gputui.filewrite import WriteFailed

# ------------------------------------------------------------------ gputui run
SHORT_FLAGS = {  # flag dest -> config key
    "devices": "devices.spec", "strategy": "strategy.name", "epochs": "run.epochs",
    "batch_size": "optim.batch_size", "lr": "optim.lr", "seed": "run.seed",
    "nnodes": "dist.nnodes", "node_rank": "dist.node_rank", "rdzv_endpoint": "dist.rdzv_endpoint",
}


def _add_run(sub) -> None:
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
    p.add_argument("--runs-dir", help="where run records go (default ./runs or $GPUTUI_RUNS_DIR)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("--json", action="store_true",
                   help="print the summary (or, with --dry-run, the config) as JSON on stdout")
    p.add_argument("--quiet", action="store_true",
                   help="no progress output: only the summary line and the record's path")
    p.add_argument("--exclusive", action="store_true",
                   help="refuse to start when a chosen GPU is busy with another process")
    p.set_defaults(func=cmd_run)


def resolve_config(args) -> Any:
    """The preset, --set overrides and short flags, validated; raises ConfigError."""
    from gputui.config import parse_assignment
    from gputui.presets import resolve_preset
    from gputui.training.datafiles import data_problem

    path = resolve_preset(args.preset)
    overrides = []
    for text in args.sets:
        key, value = parse_assignment(text)
        overrides.append((f"--set {text}", key, value))
    for dest, key in SHORT_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides.append((f"--{dest.replace('_', '-')}", key, value))
    cfg = load_preset(path, overrides)
    problem = data_problem(cfg)
    if problem:
        raise ConfigError(f"{path}: data: {problem}")
    return cfg


def cmd_run(args) -> int:
    """``gputui run PRESET``: train headless and print progress and a summary."""
    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        return fail(str(exc))
    if cfg.run.resume_from and not args.dry_run:  # `resume`, or --set run.resume_from=...
        from gputui.training import runlock

        folder = Path(cfg.run.resume_from)
        active = runlock.holder(folder if folder.is_dir() else folder.parent)
        if active:
            return fail(f"run.resume_from: {folder.name} is {active}; stop that run first, "
                        f"then resume")
    from gputui.usercode import code_line

    code = code_line(cfg)
    if args.dry_run:  # shows the code a preset names; imports and runs none of it
        if args.json:
            print(json.dumps(cfg.to_dict(), indent=2), end="")
        else:
            print(f"# {code} (not run by --dry-run)\n" if code else "", end="")
            print(cfg.to_toml(), end="")
        return EXIT_OK
    from gputui.printer import Printer
    from gputui.training.launcher import launch
    from gputui.training.runstore import read_summary

    from gputui.devices import busy_warnings, resolve_with_note

    devices, device_note = resolve_with_note(cfg.devices.spec, cfg.devices.fallback)
    taken = busy_warnings([d for d in devices if d.kind == "cuda"]) if args.exclusive else []
    if taken:  # NVML sees another process on a chosen GPU
        return fail(f"--exclusive: {taken[0].split('; training')[0]}; choose free GPUs "
                    f"(see `gputui devices`) or drop --exclusive")
    problem = runs_dir_problem(args.runs_dir)
    if problem:  # before any training: a record that cannot be written is lost work
        return fail(problem)
    printer = Printer(stream=sys.stderr if args.json else sys.stdout, quiet=args.quiet)
    for warning in ([device_note] if device_note else []) + busy_warnings(devices):
        printer.line(f"warning: {warning}")
    if code:
        printer.line(code)
    # Ctrl-C, SIGTERM and SIGHUP: a graceful stop that keeps the record; a second one, or a
    # stop outlasting run.stop_grace_s, kills (see gputui.training.signals)
    from gputui.training.signals import Supervisor

    sup = Supervisor(cfg.run.stop_grace_s).install()
    try:
        handle = launch(cfg, args.runs_dir, devices, device_note)
    except OSError as exc:  # WriteFailed says which file and why in one line
        return fail(str(exc) if isinstance(exc, WriteFailed) else
                    f"cannot create the run folder ({exc})")
    while not handle.done:
        for ev in handle.poll(timeout=0.2):
            _print(printer.handle, ev)
        sup.check(handle, lambda text: _print(printer.line, text))
    summary = read_summary(handle.run_dir)
    summary["run_dir"] = str(handle.run_dir)
    _print(printer.summary, summary)
    if args.json:
        _print(print, json.dumps(summary, indent=2, sort_keys=True))
    if summary["status"] == "finished":
        return EXIT_OK
    if summary["status"] in ("stopped", "killed") and sup.first:
        return sup.exit_code() or EXIT_INTERRUPTED
    return EXIT_FAILED


def _print(write, item) -> None:
    """Progress output that cannot end the run: a terminal that hung up (EIO until SIGHUP
    arrives) or a closed pipe loses the output, never the record."""
    from gputui.training.signals import detach_output

    try:
        write(item)
    except OSError:
        detach_output()


# ------------------------------------------------------------------ listings
def cmd_strategies(args) -> int:
    """``gputui strategies``: every strategy, its description, and whether it can run."""
    from gputui.config import RunConfig, apply_overrides
    from gputui.devices import DeviceSpecError, resolve_devices
    from gputui.training.strategies import registry

    try:
        cfg = apply_overrides(RunConfig(), [("--devices", "devices.spec", args.devices)],
                              check=False)
        devices = resolve_devices(args.devices)
    except (ConfigError, DeviceSpecError) as exc:
        return fail(f"--devices: {exc}")
    rows = []
    for info in registry.all_infos():
        trial = apply_overrides(cfg, [("strategy", "strategy.name", info.name)], check=False)
        reason = info.why_not(trial, devices)
        rows.append({"name": info.name, "description": info.description,
                     "multiprocess": info.multiprocess, "available": reason is None,
                     "reason": reason or ""})
    if args.json:
        print(json.dumps({"devices": [d.name for d in devices], "strategies": rows}, indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"strategies on {', '.join(d.name for d in devices)}")
    for col in ("name", "can run", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], "yes" if r["available"] else f"no: {r['reason']}",
                      r["description"])
    Console().print(table)
    return EXIT_OK


def cmd_presets(args) -> int:
    """``gputui presets``: the preset files found, each with its whole description; a preset
    that cannot be loaded is listed with the reason, and the others still are."""
    from gputui.presets import list_presets, names_code, preset_description, preset_problem

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

    return run_tui(preset=args.preset, runs_dir=args.runs_dir)


def build_parser() -> Parser:
    parser = Parser(prog="gputui", description="A terminal experiment runner for multi-GPU "
                    "training. With no command, opens the app.")
    parser.add_argument("--version", action="version", version=f"gputui {__version__}")
    parser.add_argument("--preset", help="open the app with this preset loaded")
    parser.add_argument("--runs-dir", dest="global_runs_dir", metavar="RUNS_DIR",
                        help="where run records go, for the app and every command "
                             "(default ./runs or $GPUTUI_RUNS_DIR)")
    parser.set_defaults(func=cmd_tui)
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    _add_run(sub)
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
    from gputui import cli_devices

    cli_devices.register(sub)
    from gputui import cli_compare  # runs, compare, sweep, bench-comm

    cli_compare.register(sub)
    from gputui import cli_resume

    cli_resume.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gputui`` console script."""
    args = build_parser().parse_args(argv)
    # `gputui --runs-dir X COMMAND`: the global flag holds unless the command has its own
    if getattr(args, "runs_dir", None) is None:
        args.runs_dir = args.global_runs_dir
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
