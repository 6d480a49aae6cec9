"""`gputui sweep PRESET --devices 1,2 --strategies single,scratch,ddp [--scale-with-devices]
[--precisions fp32,bf16] [--compile off,default] [--channels-last off,on]`.

Runs the grid one run after another with live progress, records every run, prints the
scaling table. An interrupted sweep is resumed with ``--resume SWEEP_ID``, or automatically
when the same sweep (same preset, overrides, devices, strategies) was left unfinished;
``--fresh`` starts over instead. Exit: 0 every point finished or skipped, 1 a point failed,
2 bad input, 130 interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gputui.core.config import ConfigError
from gputui.core.events import plural

from gputui.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, fail, set_overrides
from gputui.cli.compact import add_wide, print_compact


def register(sub) -> None:
    """Add the `sweep` subcommand."""
    p = sub.add_parser("sweep", help="run a preset over devices x strategies, print the "
                                     "scaling table",
                       description="Run a preset on every device count x strategy, one run "
                                   "after another. Points that cannot run here are skipped "
                                   "with the reason. Interrupted sweeps resume.")
    p.add_argument("preset", nargs="?", help="a preset file or name (optional with --resume)")
    p.add_argument("--devices", default="1,2", help="device counts, e.g. 1,2 (of the kind "
                                                    "--kind says), or cpu,cpu*2")
    p.add_argument("--kind", choices=("auto", "gpu", "cpu"), default="auto",
                   help="what the counts are: gpu (GPUs), cpu (CPU virtual devices), or auto "
                        "(GPUs when the preset names GPUs and this machine has some)")
    p.add_argument("--strategies", default="single,scratch",
                   help="comma list, e.g. single,scratch,dp,ddp,model_parallel")
    p.add_argument("--scale-with-devices", action="store_true",
                   help="batch and lr times the device count (256/0.1 on one, 512/0.2 on two)")
    p.add_argument("--precisions", metavar="LIST", help="also sweep run.precision, e.g. "
                                                         "fp32,bf16")
    p.add_argument("--compile", metavar="LIST", help="also sweep run.compile, e.g. off,default")
    p.add_argument("--channels-last", metavar="LIST", help="also sweep run.channels_last: off,on")
    p.add_argument("--contexts", metavar="LIST", help="also sweep data.context (tokens per "
                                                       "window), e.g. 256,512: where single's "
                                                       "activations outgrow a device and cp's "
                                                       "still fit")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a preset key for every run (repeatable)")
    p.add_argument("--epochs", type=int, help="epochs of every run")
    p.add_argument("--runs-dir", help="where run records go (default ./runs or $GPUTUI_RUNS_DIR)")
    p.add_argument("--resume", metavar="SWEEP_ID", help="continue this sweep")
    p.add_argument("--fresh", action="store_true", help="never resume automatically")
    p.add_argument("--export", metavar="DIR", help="also write scaling.csv/.md/.json (and PNG "
                                                    "plots when matplotlib is installed) there")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run each point N times (passes over the grid, interleaved) and show "
                        "the median and min-max")
    p.add_argument("--predict", action="store_true",
                   help="print the predicted scaling table without training (measures what "
                        "this machine has not measured yet)")
    p.add_argument("--json", action="store_true", help="print the final table as JSON")
    add_wide(p)
    p.set_defaults(func=cmd_sweep)


def build(args, runs_dir: Path):
    """The Sweep to run (new, resumed by id, or resumed automatically) and a note for the user;
    raises ConfigError or LookupError with a one-line message."""
    from gputui.core.presets import resolve_preset
    from gputui.runs.sweep.runner import (Sweep, list_manifests, load_manifest, parse_axis,
                                          parse_devices, resolve_kind)

    if args.resume:
        m = load_manifest(runs_dir, args.resume)
        if args.preset and resolve_preset(args.preset).resolve() != Path(m.preset).resolve():
            raise ConfigError(f"--resume {args.resume}: that sweep ran {m.preset}, not "
                              f"{args.preset}; drop the preset argument")
        resumed = Sweep(m, runs_dir, set_overrides(m.sets, None))
        resumed.claim()  # another gputui running it: refused here (runlock.InUse)
        return resumed, f"resuming sweep {m.sweep_id} over {m.kind_words()}"
    if not args.preset:
        raise ConfigError("give a preset to sweep (or --resume SWEEP_ID)")
    from gputui.core import registry
    from gputui.runs.sweep.manifest_size import grid_problem, header_problem
    from gputui.runs.prepare import load_base

    # the flags first, each where it is given: then the preset
    if args.repeat < 1:
        raise ConfigError(f"--repeat {args.repeat}: give a number of runs per point, 1 or more")
    devices = parse_devices(args.devices)
    axes = {key: parse_axis(option, key, text) for option, key, text in (
        ("--precisions", "run.precision", args.precisions),
        ("--compile", "run.compile", args.compile),
        ("--channels-last", "run.channels_last", args.channels_last),
        ("--contexts", "data.context", args.contexts)) if text is not None}
    strategies = list(dict.fromkeys(s.strip() for s in args.strategies.split(",") if s.strip()))
    if not strategies:
        raise ConfigError("--strategies: give at least one strategy, e.g. single,scratch")
    unknown = [s for s in strategies if registry.get(s) is None]
    if unknown:  # a typo is bad input; a known strategy that cannot run here is a skipped point
        raise ConfigError(f"--strategies: unknown strategy {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(registry.names())}")
    too_big = grid_problem(args.repeat, devices, strategies, axes)
    if too_big:
        raise ConfigError(too_big)
    path = str(resolve_preset(args.preset).resolve())
    sets = list(args.sets) + ([f"run.epochs={args.epochs}"] if args.epochs is not None else [])
    overrides = set_overrides(args.sets, args.epochs)  # a refusal names --epochs, as typed
    base = load_base(path, overrides)
    kind, kind_note = resolve_kind(args.kind, base.devices.spec)
    sweep = Sweep.new(path, sets, devices, strategies, args.scale_with_devices, runs_dir,
                      overrides, kind, axes, repeat=args.repeat)
    from dataclasses import asdict

    too_big = header_problem(dict(asdict(sweep.manifest), points=[]))
    if too_big:
        raise ConfigError(too_big)
    if not args.fresh:
        for old in list_manifests(runs_dir):
            if old.state != "finished" and old.params() == sweep.manifest.params():
                done = sum(p.status == "finished" for p in old.points)
                resumed = Sweep(old, runs_dir, overrides)
                resumed.claim()  # the same sweep still running elsewhere: refused, one line
                return (resumed,
                        f"resuming unfinished sweep {old.sweep_id} ({done} of "
                        f"{plural(len(old.points), 'point')} done; --fresh starts over); "
                        f"{kind_note}")
    return sweep, f"sweep {sweep.manifest.sweep_id}; {kind_note}"


SHOWN_POINTS = 8  # a header names this many points at most: a grid of thousands is one line


def points_shown(points: list) -> str:
    """The points a sweep's header names: every one of a small grid, else the first few and
    how many more (each is in the manifest, and the progress names each as it runs)."""
    keys = [p.key for p in points]
    if len(keys) <= SHOWN_POINTS:
        return ", ".join(keys)
    return f"{', '.join(keys[:SHOWN_POINTS - 2])}, ... and {len(keys) - SHOWN_POINTS + 2:,} more"


def cmd_sweep(args) -> int:
    """``gputui sweep``: run the grid, then print the scaling table."""
    from gputui.cli.common import runs_dir_problem
    from gputui.core.filewrite import WriteFailed, folder_problem
    from gputui.core.runstore import default_runs_dir

    if args.predict:  # checks the folders it writes (the measure cache, --runs-dir) itself
        return _predict(args)
    # before anything: records or exports that cannot be written would lose the sweep's work
    problem = runs_dir_problem(args.runs_dir) or (
        folder_problem(args.export, "--export") if args.export else None)
    if problem:
        return fail(problem)
    runs_dir = Path(args.runs_dir) if args.runs_dir else default_runs_dir()
    try:
        sweep, note = build(args, runs_dir)
    except (ConfigError, LookupError) as exc:
        return fail(str(exc))
    try:
        return _run_sweep(args, sweep, note, runs_dir)
    except WriteFailed as exc:  # the disk filled up during the sweep: one line, exit 1
        print(f"gputui: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _run_sweep(args, sweep, note: str, runs_dir: Path) -> int:
    from gputui.cli.output import emit
    from gputui.runs.compare.table import (BREAKDOWN_LEGEND, SWEEP_COLUMNS, TABLE_COLUMNS, as_plain,
                                     columns_for, compare, table_rows)
    from gputui.core import signals
    from gputui.runs.sweep.progress import SweepProgress

    out = sys.stderr if args.json else sys.stdout
    m = sweep.manifest
    sweep.claim()  # before its manifest is first written: a second command finds it held
    # SIGINT, SIGTERM and SIGHUP (a closed terminal signals the whole group): the running
    # point stops gracefully with the signal named in its record, no further point starts,
    # the manifest says "interrupted"; a second signal kills the point (signals.Supervisor)
    sup = sweep.supervisor = signals.take_over(sweep.base.run.stop_grace_s)
    sup.grace_s = sweep.base.run.stop_grace_s
    progress = SweepProgress(m.points, stream=out, epochs=sweep.base.run.epochs)
    with progress:
        progress.line(f"{note}: {plural(len(m.points), 'point')} ({points_shown(m.points)}); "
                      f"manifest {sweep.save()}")
        state = sweep.run(progress.on_point, progress.on_event)
    if state == "interrupted":
        print(f"sweep interrupted; resume with: gputui sweep --resume {m.sweep_id}", file=out)
    for p in m.points:
        if p.status == "skipped":
            print(f"skipped {p.key}: {p.reason}", file=out)
    from gputui.runs.compare.table import summary_lines
    from gputui.runs.sweep.repeats import COLUMNS as REPEAT_COLUMNS, grouped, session_warnings

    items = compare(sweep.run_dirs(), runs_dir, only_compared=True)
    if "data.context" in m.axes:  # the context-length sweep: each row names its length
        for it in items:
            it.row.fast = f"{it.row.fast} context={it.row.context}".strip()
    session_warnings(items, m.points)
    groups = grouped(items, m.points) if m.repeat > 1 else None
    if args.export:
        _export(items, sweep.run_dirs(), Path(args.export), out, groups)
    columns = columns_for(items, SWEEP_COLUMNS if m.axes else TABLE_COLUMNS)
    rows = table_rows(items, columns)
    title = f"sweep {m.sweep_id} over {m.kind_words()}"
    if groups is not None:
        rows, columns = groups, REPEAT_COLUMNS
        title += f", each point {m.repeat} times (median, min–max)"
    if groups is None and not args.json and not args.wide:
        print_compact(items, title, fast=bool(m.axes))
    else:
        emit(rows, columns, "json" if args.json else "table", None, title,
             json_data={"sweep": _manifest_dict(m), "runs": as_plain(items),
                        **({"groups": groups} if groups is not None else {})})
        if not args.json and any(it.breakdown for it in items):
            print(BREAKDOWN_LEGEND)
    for text in summary_lines(items):
        if any(w in text for w in ("FLAGGED", "NOISY", "contended", "short of",
                                   "no speed figures")):
            print(text, file=out)
    if state == "interrupted" and sup.first:
        from gputui.cli.common import interrupted

        done = sum(p.status == "finished" for p in m.points)
        return interrupted(sup.first, f": {done} of {plural(len(m.points), 'point')} finished; "
                                      f"their records and the manifest are kept (continue: "
                                      f"gputui sweep --resume {m.sweep_id})")
    if state == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_FAILED if any(p.status == "failed" for p in m.points) else EXIT_OK


def _predict(args) -> int:
    """``gputui sweep PRESET --predict``: the grid's predicted table, no training."""
    from gputui.cli.predict import counts_of, parse_strategies, print_prediction
    from gputui.core.presets import resolve_preset
    from gputui.runs.prepare import load_base
    from gputui.runs.sweep.runner import parse_devices, resolve_kind

    if not args.preset:
        return fail("--predict: give a preset to predict")
    # what only a trained sweep does is refused, not dropped without a word
    unused = [flag for flag, given in (
        ("--resume", args.resume), ("--fresh", args.fresh), ("--export", args.export),
        ("--repeat", args.repeat != 1), ("--precisions", args.precisions),
        ("--compile", args.compile), ("--channels-last", args.channels_last),
        ("--contexts", args.contexts)) if given]
    if unused:
        return fail(f"--predict trains nothing, so {', '.join(unused)} would do nothing; drop "
                    f"{'it' if len(unused) == 1 else 'them'} or drop --predict")
    try:
        path = str(resolve_preset(args.preset).resolve())
        counts = counts_of(parse_devices(args.devices))
        strategies = parse_strategies(_predicted(args.strategies))
        cfg = load_base(path, set_overrides(args.sets, args.epochs))
        kind, _ = resolve_kind(args.kind, cfg.devices.spec)
    except (ConfigError, LookupError) as exc:
        return fail(str(exc))
    if args.scale_with_devices:
        cfg = cfg.replace(optim={"scale_with_devices": True})
    return print_prediction(cfg, counts, strategies, kind, args.runs_dir, args.json, False,
                            Path(args.preset).stem)


def _predicted(text: str) -> str:
    """The sweep's strategies that have a prediction (the others, known to the registry, are
    rows a prediction leaves out); an unknown name is refused as in a trained sweep."""
    from gputui.core import registry
    from gputui.runs.predict.scaling import STRATEGIES

    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if registry.get(s) is None]
    if unknown:
        raise ConfigError(f"--strategies: unknown strategy {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(registry.names())}")
    return ",".join(s for s in names if s in STRATEGIES) or text


def _manifest_dict(m) -> dict:
    from dataclasses import asdict

    return asdict(m)


def _export(items, dirs, folder: Path, out, groups=None) -> None:
    from gputui.runs.compare.table import as_plain, columns_for, table_rows
    from gputui.runs.compare.export import ExportError, plot_curves, plot_speedup, render, to_json
    from gputui.runs.sweep.repeats import COLUMNS as REPEAT_COLUMNS

    from gputui.core.filewrite import WriteFailed, write_atomic

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteFailed(folder, exc) from None
    columns = columns_for(items)
    rows = table_rows(items, columns)
    write_atomic(folder / "scaling.csv", render(rows, columns, "csv"))
    write_atomic(folder / "scaling.md", render(rows, columns, "md"))
    write_atomic(folder / "scaling.json", to_json(as_plain(items)))
    if groups is not None:  # --repeat: one row per point, median and min-max
        write_atomic(folder / "scaling-repeats.csv", render(groups, REPEAT_COLUMNS, "csv"))
        write_atomic(folder / "scaling-repeats.json", to_json(groups))
    try:
        plot_curves(items, folder / "curves.png")
        plot_speedup(items, folder / "speedup.png")
        from gputui.runs.compare.export import plot_waterfall

        plot_waterfall(items, folder / "waterfall.png")
    except ExportError as exc:
        print(f"no plots: {exc}", file=out)
    print(f"exported to {folder}", file=out)

