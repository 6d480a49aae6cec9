"""`gputui verify PRESET --devices SPEC [--strategies a,b] [--steps N] [--json]`.

Trains a few steps with ``single`` and with each strategy, from the same initial parameters,
as ``gputui run`` trains them, and says per strategy whether it trained the same model
(:mod:`gputui.runs.verify`): the largest parameter and loss differences against single, pass
or fail against the precision's tolerance, and on a failure the first step and parameter that
diverged. Progress on stderr, the table (or JSON) on stdout. Exit: 0 every strategy passed,
1 one failed (or its run did), 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import sys

from gputui.cli.common import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, fail, runs_dir_problem,
                               set_overrides)
from gputui.core.config import ConfigError

COLUMNS = ("strategy", "devices", "result", "max_param_diff", "max_param", "max_loss_diff",
           "first_step", "first_diverged", "run_id")


def register(sub) -> None:
    """Add the `verify` subcommand."""
    from gputui.runs.verify import DEFAULT_STEPS

    p = sub.add_parser("verify", help="check that each strategy trains the same model as single",
                       description="Train a few steps with single and with each strategy from "
                                   "the same initial parameters and batches, as `gputui run` "
                                   "trains them, and report per strategy the largest "
                                   "parameter and loss difference against single, pass or "
                                   "fail against float32's tolerance (bf16/fp16: theirs), and "
                                   "the first step and parameter that diverged.")
    p.add_argument("preset", help="a preset file or name (its model, your model.factory too)")
    p.add_argument("--devices", help="the devices the strategies run on, e.g. cpu*2 or 0,1 "
                                     "(default: the preset's); single runs on the first")
    p.add_argument("--strategies", default="",
                   help="comma list of strategies (default: every one that can run there)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps to compare")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a preset key (repeatable)")
    p.add_argument("--runs-dir", help="where the verify runs are recorded (default ./runs)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    """``gputui verify``: check the input, run, print the verdicts."""
    from gputui.core.devices import DeviceSpecError
    from gputui.core.presets import resolve_preset
    from gputui.hw.discovery import resolve_with_gpus
    from gputui.runs.prepare import load_base
    from gputui.runs.verify import strategies_for

    if not 1 <= args.steps <= 1000:
        return fail(f"--steps must be from 1 to 1000; got {args.steps}")
    problem = runs_dir_problem(args.runs_dir)
    if problem:
        return fail(problem)
    try:
        path = str(resolve_preset(args.preset).resolve())
        overrides = set_overrides(args.sets)
        if args.devices:
            overrides.append(("--devices", "devices.spec", args.devices))
        # the preset's values and data; each run's rules are checked at its own launch
        cfg = load_base(path, overrides)
        devices, _, _ = resolve_with_gpus(cfg.devices.spec, "none")
        named = [s.strip() for s in args.strategies.split(",") if s.strip()]
        strategies = strategies_for(cfg, devices, named)
    except DeviceSpecError as exc:
        return fail(f"--devices: {exc}")
    except (ConfigError, LookupError) as exc:
        return fail(str(exc))
    return _print(args, cfg, devices, strategies)


def _print(args, cfg, devices, strategies: list[str]) -> int:
    from gputui.cli.output import emit
    from gputui.runs.verify import verdict, verify

    def line(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        report = verify(cfg, devices, strategies, args.steps, args.runs_dir, line)
    except KeyboardInterrupt:
        print("verify interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigError as exc:  # a rule a strategy's run breaks (each is checked at launch)
        return fail(str(exc))
    except (RuntimeError, ValueError) as exc:
        print(f"gputui: verify failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    rows = []
    for o in report.outcomes:
        d = o.to_dict()
        d["result"] = verdict(o)
        for key in ("max_param_diff", "max_loss_diff"):
            d[key] = "-" if d[key] is None else f"{d[key]:.3g}"
        rows.append(d)
    title = (f"verify {args.preset}: {report.steps} steps against single "
             f"(run {report.single_run}), {report.precision} tolerance rtol {report.rtol:g} "
             f"atol {report.atol:g}"
             + (f"; ROUNDING: beyond it, within the {report.bound:.2g} the optimizer's "
                f"update allows, and the same parameters part when single only sums in "
                f"another order (run {report.control_run})"
                if any(o.rounding for o in report.outcomes) else ""))
    if report.interrupted:  # the stop contract: what was compared, then one line
        from gputui.cli.common import interrupted

        if rows or args.json:
            emit(rows, COLUMNS, "json" if args.json else "table", None,
                 f"{title} (interrupted: partial)", json_data=report.to_dict())
        where = f"during {report.interrupted_at}'s run (its record is kept)" \
            if report.interrupted_at else ""
        return interrupted(report.interrupted,
                           f"{where}: {len(report.outcomes)} of {len(strategies)} "
                           f"strategies compared with single; no verdict on the rest")
    emit(rows, COLUMNS, "json" if args.json else "table", None, title,
         json_data=report.to_dict())
    return EXIT_OK if report.passed else EXIT_FAILED
