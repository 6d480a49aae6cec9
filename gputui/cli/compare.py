"""`gputui runs` and `gputui compare`.

``register(subparsers)`` adds the two subcommands. Nothing here imports torch. Bad input is one
line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gputui.cli.common import EXIT_OK, fail, finite
from gputui.cli.compact import add_wide, print_compact
from gputui.cli.output import add_output, emit, form_of
from gputui.core.filewrite import WriteFailed, file_problem, folder_problem, os_error_in
from gputui.core.scores import columns_for

# history and compare are imported by the commands that use them: building the parser must
# stay cheap, since `gputui` (the app) builds it before its first paint.


def register(sub) -> None:
    """Add runs and compare to an argparse subparsers object."""
    p = sub.add_parser("runs", help="list recorded runs (filters, --json)",
                       description="Every recorded run, newest first: id, name, strategy, "
                                   "devices, batch, lr, time per epoch, samples/s, final test "
                                   "accuracy, status, date.")
    p.add_argument("--runs-dir", help="where run records are (default ./runs or $GPUTUI_RUNS_DIR)")
    p.add_argument("--strategy", help="only these strategies (comma list)")
    p.add_argument("--status", help="only these statuses: finished, failed, stopped, killed, "
                                    "running, incomplete, unreadable (comma list)")
    p.add_argument("--name", help="only runs whose name or id contains this")
    p.add_argument("--last", type=int, metavar="N", help="only the newest N runs")
    add_output(p)
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("compare", help="compare runs: speedup, scaling efficiency, comm share",
                       description="Compare recorded runs. Speedup is against the matching "
                                   "one-device run (same model, data and precision; same batch "
                                   "per device, else same global batch).")
    p.add_argument("runs", nargs="*", help="run ids (or unique parts of them) or run folders")
    p.add_argument("--sweep", metavar="SWEEP_ID", help="compare every run of this sweep")
    p.add_argument("--runs-dir", help="where run records are (default ./runs or "
                                      "$GPUTUI_RUNS_DIR)")
    p.add_argument("--plots", metavar="DIR", help="write curves.png and speedup.png there "
                                                  "(needs matplotlib: pip install 'gputui[plots]')")
    p.add_argument("--tensorboard", metavar="DIR", help="write the runs' scalars for TensorBoard")
    p.add_argument("--target-acc", type=finite, metavar="PERCENT",
                   help="time and energy to this test accuracy (default: the baseline's final)")
    p.add_argument("--target-loss", type=finite, metavar="LOSS",
                   help="time and energy to this validation loss (language models)")
    p.add_argument("--waterfall", action="store_true",
                   help="print each run's scaling waterfall: the ideal speedup, what each "
                        "cause took away, the measured speedup (--plots adds waterfall.png)")
    add_output(p)
    add_wide(p)
    p.set_defaults(func=cmd_compare)


def cmd_runs(args) -> int:
    """``gputui runs``: the run table, filtered."""
    from gputui.runs import history

    if args.last is not None and args.last < 1:
        return fail(f"--last {args.last}: give a positive number of runs")
    form = form_of(args)  # a ConfigError is main's one line, exit 2
    problem = outputs_problem(args.output)
    if problem:
        return fail(problem)
    try:
        every = history.load_rows(args.runs_dir)
    except OSError as exc:
        return fail(f"cannot read the runs folder: {exc}")
    problem = filters_problem(args, every)
    if problem:
        return fail(problem)
    rows = history.filter_rows(every, args.strategy, args.status, args.name, args.last)
    if form == "table" and not rows:
        if args.strategy or args.status or args.name:
            print("no run matches the filters")
            return EXIT_OK
        from gputui.cli.printer import shown_path
        from gputui.core.runstore import default_runs_dir

        folder = Path(args.runs_dir) if args.runs_dir else default_runs_dir()
        missing = "" if folder.is_dir() else ": the folder does not exist"
        print(f"no runs recorded yet in {shown_path(folder)}{missing} (try: gputui run "
              f"quickstart)")
        return EXIT_OK
    plain = [r.to_dict() for r in rows]
    try:
        emit(plain, columns_for(history.COLUMNS, plain), form, args.output, "runs",
             json_data=plain)
    except WriteFailed as exc:
        return fail(str(exc))
    if form == "table":  # what could not be read, under the table (--json has it per row)
        for r in rows:
            if r.problem:
                print(f"{r.id}: {r.problem}")
    return EXIT_OK


STATUSES = ("finished", "failed", "stopped", "killed", "running", "incomplete", "unreadable",
            "unknown")


def filters_problem(args, rows) -> str | None:
    """Why a filter of ``gputui runs`` can match nothing whatever is recorded (empty, or a
    name that is no strategy or status), as one line naming the flag, or None."""
    from gputui.core import registry

    if args.name is not None and not args.name.strip():
        return "--name: give part of a run name or id"
    known = {"--strategy": list(dict.fromkeys([*registry.names(),
                                               *sorted({r.strategy for r in rows} - {""})])),
             "--status": list(STATUSES)}
    for flag, text in (("--strategy", args.strategy), ("--status", args.status)):
        if text is None:
            continue
        items = [w.strip() for w in text.split(",") if w.strip()]
        unknown = [w for w in items if w not in known[flag]]
        if not items or unknown:
            what = f"{', '.join(map(repr, unknown))} is not one" if unknown else "give one"
            label = f"{flag} {text}" if text.strip(", ") else flag
            return f"{label}: {what} of {', '.join(known[flag])} (a comma list)"
    return None


def outputs_problem(output: str | None = None, plots: str | None = None,
                    tensorboard: str | None = None) -> str | None:
    """Why an output file or folder cannot be written, as one line naming its flag; checked
    before the work whose result would go there."""
    checks = [(output, file_problem, "--output"), (plots, folder_problem, "--plots"),
              (tensorboard, folder_problem, "--tensorboard")]
    for where, check, flag in checks:
        problem = check(where, flag) if where else None
        if problem:
            return problem
    return None


def resolve_runs(refs: list[str], sweep_id: str | None, runs_dir: str | None) -> list[Path]:
    """Run folders from ids/paths and/or a sweep; LookupError (one line) when one is unknown."""
    from gputui.core.runstore import default_runs_dir, is_run_folder
    from gputui.runs import history
    from gputui.runs.sweep.runner import load_manifest

    dirs = [history.find_run(ref, runs_dir) for ref in refs]
    if sweep_id:
        base = Path(runs_dir) if runs_dir else default_runs_dir()
        manifest = load_manifest(base, sweep_id)
        dirs += [base / p.run_id for p in manifest.points
                 if p.run_id and is_run_folder(base / p.run_id)]
    return list(dict.fromkeys(dirs))


def cmd_compare(args) -> int:
    """``gputui compare RUN...``: the comparison table, exports and plots."""
    from gputui.runs.compare.table import (TABLE_COLUMNS, as_plain, compare, summary_lines,
                                           table_rows)
    from gputui.runs.compare.export import ExportError

    if not args.runs and not args.sweep:
        return fail("give run ids to compare, or --sweep SWEEP_ID (see `gputui runs`)")
    form = form_of(args)  # a ConfigError is main's one line, exit 2
    problem = outputs_problem(args.output, args.plots, args.tensorboard)
    if problem:
        return fail(problem)
    try:
        dirs = resolve_runs(args.runs, args.sweep, args.runs_dir)
    except LookupError as exc:
        return fail(str(exc))
    acc = args.target_acc
    if acc is not None and not 0 < acc <= 100:
        return fail(f"--target-acc must be a percentage above 0 and at most 100; got {acc:g}")
    if args.target_loss is not None and not args.target_loss > 0:
        return fail(f"--target-loss must be a loss above 0; got {args.target_loss:g}")
    items = compare(dirs, args.runs_dir, only_compared=bool(args.sweep and not args.runs),
                    target_acc=None if acc is None else acc / 100, target_loss=args.target_loss)
    try:
        write_extras(items, dirs, args.plots, args.tensorboard)
        groups = _repeat_groups(items, args.sweep, args.runs_dir)
        if groups is not None:  # a sweep run with --repeat: one row per point, with the spread
            from gputui.runs.sweep.repeats import COLUMNS

            emit(groups, COLUMNS, form, args.output, f"sweep {args.sweep}: median, min–max",
                 json_data={"groups": groups, "runs": as_plain(items)})
        elif form == "table" and not args.wide:
            print_compact(items, "comparison")
        else:
            columns = columns_for(TABLE_COLUMNS, [it.row for it in items])
            emit(table_rows(items, columns), columns, form, args.output, "comparison",
                 json_data=as_plain(items))
    except (ExportError, WriteFailed) as exc:
        return fail(str(exc))
    if form == "table":
        from gputui.runs.compare.table import BREAKDOWN_LEGEND

        for line in summary_lines(items):
            if line != BREAKDOWN_LEGEND or args.wide:  # it explains the --wide columns
                print(line)
        if args.waterfall:
            print_waterfalls(items)
    return EXIT_OK


def print_waterfalls(items) -> None:
    """Each compared run's scaling waterfall, or why it has none."""
    from gputui.runs.compare.waterfall import lines

    for it in items:
        r = it.row
        if it.waterfall is None:
            why = ("no speedup" if it.speedup is None else "no step breakdown recorded")
            print(f"\n{r.id}: no waterfall ({why})")
            continue
        title = (f"\n{r.id} ({r.strategy} on {r.devices} devices) against {it.baseline}: "
                 f"scaling waterfall, speedup x")
        print("\n".join(lines(it.waterfall, title=title)))


def _repeat_groups(items, sweep_id: str | None, runs_dir: str | None):
    """The grouped rows of a sweep run with --repeat (None otherwise)."""
    if not sweep_id:
        return None
    from gputui.core.runstore import default_runs_dir
    from gputui.runs.sweep.repeats import grouped, session_warnings
    from gputui.runs.sweep.runner import load_manifest

    m = load_manifest(Path(runs_dir) if runs_dir else default_runs_dir(), sweep_id)
    session_warnings(items, m.points)
    return grouped(items, m.points) if m.repeat > 1 else None


def write_extras(items, dirs, plots: str | None, tensorboard: str | None) -> list[Path]:
    """PNG plots and TensorBoard scalars, when asked; returns the paths written."""
    from gputui.runs.compare.export import plot_curves, plot_speedup, to_tensorboard

    out = []
    if plots:
        out.append(plot_curves(items, Path(plots) / "curves.png"))
        out.append(plot_speedup(items, Path(plots) / "speedup.png"))
        from gputui.runs.compare.export import plot_waterfall

        if (drawn := plot_waterfall(items, Path(plots) / "waterfall.png")) is not None:
            out.append(drawn)
    if tensorboard:
        try:
            out += to_tensorboard(dirs, tensorboard)
        except OSError as exc:
            cause = os_error_in(exc)
            if cause is None or isinstance(exc, WriteFailed):
                raise
            raise WriteFailed(Path(cause.filename or tensorboard), cause) from None
    for path in out:
        print(f"wrote {path}", file=sys.stderr)
    return out
