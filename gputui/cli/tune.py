"""`gputui tune PRESET --devices N [--budget MINUTES] [--top K] [--json] [-o BEST.toml]`.

Ranks the candidate configurations (strategy, micro-batches, precision, compile,
channels_last, batch per device) by the prediction, measuring what it needs on this machine
(:mod:`gputui.runs.tune.tuner`), confirms the best few by short real runs within the time budget,
prints predicted against measured with the chosen one marked, and writes the chosen
configuration as a preset. Progress goes to stderr. Exit: 0 a configuration was chosen, 1
none could be (or a measurement failed), 2 bad input, 130 interrupted (the partial table is
printed; no preset is written).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from gputui.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, fail, set_overrides, finite
from gputui.core.config import ConfigError

SHOWN = 8  # table rows beyond the confirmed ones (--json lists every candidate)


def register(sub) -> None:
    """Add the `tune` subcommand."""
    p = sub.add_parser("tune", help="find the fastest configuration of a preset: predicted, "
                                    "then confirmed by short runs",
                       description="Rank the configurations a preset can run in on N devices "
                                   "(strategy, micro-batches, precision, compile, "
                                   "channels_last, batch per device) by the prediction, confirm "
                                   "the best few by short runs within the time budget, and "
                                   "write the best as a preset.")
    p.add_argument("preset", help="a preset file or name")
    p.add_argument("--devices", required=True, help="how many devices: 2 (of the kind --kind "
                                                    "says) or cpu*2")
    p.add_argument("--kind", choices=("auto", "gpu", "cpu"), default="auto",
                   help="what the count is (as for sweep)")
    p.add_argument("--budget", type=finite, default=10.0, metavar="MINUTES",
                   help="time for everything, measuring the prediction's inputs included")
    p.add_argument("--top", type=int, default=3, metavar="K", help="candidates confirmed by a "
                                                                    "run")
    p.add_argument("--steps", type=int, default=40, help="steps of each confirming run")
    p.add_argument("--strategies", help="comma list (default: every one with a prediction)")
    p.add_argument("--micro-batches", metavar="LIST", help="e.g. 1,2,4 (the default)")
    p.add_argument("--precisions", metavar="LIST", help="e.g. fp32,bf16 (default: those the "
                                                         "devices have)")
    p.add_argument("--compile", metavar="LIST", help="e.g. off,default (the default)")
    p.add_argument("--channels-last", metavar="LIST", help="off,on (default for conv models)")
    p.add_argument("--batch-per-device", metavar="LIST", help="e.g. 128,256 (default: the "
                                                                "preset's and twice it)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a preset key (repeatable)")
    p.add_argument("--runs-dir", help="where the confirming runs are recorded (default ./runs "
                                      "or $GPUTUI_RUNS_DIR)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-o", "--output", metavar="BEST.toml", help="where the chosen preset is "
                   "written (default <preset>-tuned.toml in your presets folder: ./presets, or "
                   "~/.config/gputui/presets when ./presets is gputui's own; "
                   "$GPUTUI_PRESETS_DIR overrides)")
    p.set_defaults(func=cmd_tune)


def ints(option: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() and int(t) > 0 for t in items):
        raise ConfigError(f"{option} {text}: give a comma list of whole numbers above 0, "
                          f"e.g. {option} 1,2")
    return list(dict.fromkeys(int(t) for t in items))


def build(args):
    """The Tuner and its axes; ConfigError / LookupError (one line) on bad input."""
    from gputui.core import registry
    from gputui.core.presets import resolve_preset
    from gputui.core.runstore import default_runs_dir
    from gputui.core.cachedir import cache_dir
    from gputui.runs.prepare import load_base
    from gputui.runs.sweep.runner import parse_axis, resolve_kind
    from gputui.runs.tune.tuner import Axes, Tuner

    text = args.devices.strip()
    count = text[4:] if text.startswith("cpu*") else text
    if not count.isdigit() or int(count) < 1:
        raise ConfigError(f"--devices {args.devices}: give a device count, e.g. --devices 2 "
                          f"(or cpu*2)")
    if not args.budget > 0:
        raise ConfigError(f"--budget {args.budget:g}: give minutes above 0, e.g. --budget 5")
    if args.top < 1 or args.steps < 20:
        raise ConfigError(f"--top {args.top} --steps {args.steps}: confirm at least 1 "
                          f"candidate, with at least 20 steps (a steady state needs them)")
    path = str(resolve_preset(args.preset).resolve())
    overrides = set_overrides(args.sets)
    base = load_base(path, overrides)
    from gputui.runs.predict.scaling import unmodelled

    if unmodelled(base):  # tune ranks its candidates by predict's models
        raise ConfigError(str(unmodelled(base)).replace("predict's models", "tune's "
                                                        "predictions"))
    kind = "cpu" if text.startswith("cpu*") else resolve_kind(args.kind, base.devices.spec)[0]
    strategies = None
    if args.strategies is not None:
        strategies = list(dict.fromkeys(s.strip() for s in args.strategies.split(",")
                                        if s.strip()))
        bad = [s for s in strategies if registry.get(s) is None] or (
            [] if strategies else ["nothing"])
        if bad:
            raise ConfigError(f"--strategies {args.strategies}: unknown {', '.join(bad)}; "
                              f"known: {', '.join(registry.names())}")
    def axis(option: str, key: str, text: str | None) -> list | None:
        return None if text is None else parse_axis(option, key, text)

    axes = Axes(strategies, ints("--micro-batches", args.micro_batches),
                axis("--precisions", "run.precision", args.precisions),
                axis("--compile", "run.compile", args.compile),
                axis("--channels-last", "run.channels_last", args.channels_last),
                ints("--batch-per-device", args.batch_per_device))
    runs_dir = Path(args.runs_dir) if args.runs_dir else default_runs_dir()
    tuner = Tuner(path, list(args.sets), overrides, base, int(count), kind, runs_dir,
                  cache_dir() / "predict-runs", args.budget * 60, args.top, args.steps)
    return tuner, axes


def cmd_tune(args) -> int:
    """``gputui tune``: rank, confirm, print, write the preset."""
    from gputui.cli.common import runs_dir_problem
    from gputui.core.filewrite import WriteFailed, file_problem

    from gputui.core.presets import user_presets_dir

    # the user's presets folder, never the project's own presets/ (see user_presets_dir)
    out = Path(args.output) if args.output else Path.cwd() / user_presets_dir() / (
        f"{Path(args.preset).stem}-tuned.toml")
    problem = runs_dir_problem(args.runs_dir) or file_problem(out, "-o")
    if problem:
        return fail(problem)
    try:
        tuner, axes = build(args)
        tuner.line = lambda text: print(text, file=sys.stderr, flush=True)
        cands = tuner.candidates(axes)
    except (ConfigError, LookupError) as exc:
        return fail(str(exc))
    if not cands:
        first = tuner.skipped[0] if tuner.skipped else ("", "no candidate")
        return fail(f"no candidate configuration can run on {tuner.n} {tuner.kind} devices "
                    f"(e.g. {first[0]}: {first[1]})")
    least, why = tuner.least_budget_s()
    if tuner.budget_s < least:  # before anything runs: a budget that confirms nothing
        return fail(f"--budget {args.budget:g}: too short to confirm even one candidate "
                    f"(about {least:.0f} s here: {why}); give --budget "
                    f"{math.ceil(least / 6) / 10:g} or more")
    tuner.line(f"tune {Path(tuner.preset).stem} on {tuner.n} {tuner.kind} devices: "
               f"{len(cands)} candidates ({len(tuner.skipped)} cannot run here), budget "
               f"{args.budget:g} min")
    try:
        return _tune(args, tuner, cands, out)
    except WriteFailed as exc:
        print(f"gputui: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _tune(args, tuner, cands, out: Path) -> int:
    from gputui.cli.common import interrupted
    from gputui.core import signals
    from gputui.runs.sweep.progress import SweepProgress
    from gputui.runs.tune.result import choose, results

    # the stop contract (docs/failures.md): the process-wide Supervisor, taken by main
    sup = signals.take_over(tuner.base.run.stop_grace_s)
    sup.grace_s = tuner.base.run.stop_grace_s
    try:
        tuner.predict(cands)
    except KeyboardInterrupt:
        print("tune interrupted while measuring the prediction's inputs: nothing ranked yet",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except signals.Interrupted as exc:
        return interrupted(exc.signum, " while measuring the prediction's inputs: nothing "
                                       "ranked, no preset written (the figures measured "
                                       "before it are kept for the next tune)")
    except RuntimeError as exc:
        print(f"gputui: tune: a measurement failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    tuner.line(f"ranked {len(tuner.ranked)} candidates in {tuner.elapsed():.0f} s; confirming "
               f"the top {args.top} with runs of {tuner.steps} steps")
    for note in tuner.budget_notes:
        tuner.line(note)
    if sup.first is not None:  # came as the ranking ended: confirm nothing, write nothing
        return interrupted(sup.first, f": {len(tuner.ranked)} candidates ranked, none "
                                      f"confirmed, no preset written")
    progress = SweepProgress(tuner.plan_confirm(), stream=sys.stderr, epochs=1)
    with progress:
        state = tuner.confirm(sup, progress.on_point, progress.on_event)
    points = tuner.sweep.manifest.points if tuner.sweep else []
    over = [p for p in points if p.status == "skipped" and "budget" in p.reason]
    res = results(tuner.ranked, points, tuner.runs_dir)
    best, notes = choose(res)
    if over:
        notes.insert(0, f"confirmed {len(points) - len(over)} of {len(points)}: the time budget "
                        f"({args.budget:g} min) stopped the rest ({over[0].reason})")
    written = None
    if state == "interrupted":
        notes.append("interrupted: the table is partial and no preset was written")
    elif best is not None:
        written = _write(tuner, best, out, args)
        notes.append(f"preset written to {written}: gputui run {written}")
    _print(args, tuner, res, best, notes, state, written)
    if state == "interrupted" and sup.first is not None:
        done = sum(p.status == "finished" for p in points)
        return interrupted(sup.first, f": {done} of {len(points)} confirming runs finished "
                                      f"(their records are kept); the table is partial and "
                                      f"no preset was written")
    if state == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_OK if best is not None else EXIT_FAILED


def _write(tuner, best, out: Path, args) -> Path:
    from gputui.core.filewrite import make_folder, write_atomic
    from gputui.runs.tune.result import preset_text

    cfg = tuner.config_of(best.ranked.cand).replace(run={"name": f"{tuner.base.run.name}-tuned"})
    command = f"gputui tune {Path(tuner.preset).stem} --devices {args.devices}"
    make_folder(out.parent)
    return write_atomic(out, preset_text(cfg, best, tuner.preset, command,
                                         tuner.global_batch()))


def _print(args, tuner, res, best, notes, state, written) -> None:
    from gputui.runs.tune.result import COLUMNS, HEADERS, row_of

    if args.json:
        data = {"preset": tuner.preset, "devices": tuner.n, "kind": tuner.kind,
                "budget_s": tuner.budget_s, "elapsed_s": round(tuner.elapsed(), 1),
                "state": state, "chosen": best.to_dict() if best else None, "notes": notes,
                "written": str(written) if written else None,
                "budget_notes": tuner.budget_notes,
                "candidates": [r.to_dict() for r in res],
                "cannot_run": [{"candidate": c, "reason": w} for c, w in tuner.skipped]}
        print(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    shown = [r for r in res if r.status] + [r for r in res if not r.status and
                                            r.ranked.step_s and not r.ranked.reason][:SHOWN]
    table = Table(title=Text(f"tune {Path(tuner.preset).stem} on {tuner.n} {tuner.kind} "
                             f"devices ({tuner.elapsed():.0f} s)"))
    for c in COLUMNS:
        table.add_column(HEADERS.get(c, c), justify="left" if c in ("candidate", "check",
                                                                     "chosen") else "right")
    for r in shown:
        row = row_of(r, best)
        table.add_row(*(Text(row[c]) for c in COLUMNS))
    Console(width=None if sys.stdout.isatty() else 240).print(table)
    rest = len(res) - len(shown)
    unpredicted = sum(1 for r in res if r not in shown and not r.ranked.step_s)
    if rest or tuner.skipped:
        print(f"{rest} more candidates ({unpredicted} without a prediction), "
              f"{len(tuner.skipped)} cannot run here (--json lists them all, with why)")
    for note in notes:
        print(note)
