"""`gputui predict PRESET --devices 1,2 --strategies ddp,fsdp,scratch,dp [--json]`.

Prints the predicted scaling table without training: step time, samples/s, speedup,
efficiency and training memory per device for each strategy and device count, from this
machine's measurements (:mod:`gputui.runs.predict.measure`: short single-device runs and an
allreduce benchmark, kept per machine and measured when missing, with progress lines).
``gputui sweep PRESET --predict`` prints the same table for the sweep's grid. Exit: 0, 1 a
measurement failed, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gputui.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, fail
from gputui.core.config import ConfigError

COLUMNS = ("strategy", "devices", "batch", "step_ms", "samples_per_s", "speedup",
           "efficiency", "mem_per_device", "formula", "reason")


def register(sub) -> None:
    """Add the `predict` subcommand."""
    p = sub.add_parser("predict", help="predicted scaling of a preset, without training",
                       description="Predict step time, speedup, efficiency and memory per "
                                   "device for each data-parallel strategy and device count, "
                                   "from one measured single-device run and a measured "
                                   "allreduce (kept per machine; measured when missing).")
    p.add_argument("preset", help="a preset file or name")
    p.add_argument("--devices", default="1,2", help="device counts, e.g. 1,2 (or cpu,cpu*2)")
    p.add_argument("--kind", choices=("auto", "gpu", "cpu"), default="auto",
                   help="what the counts are (as for sweep)")
    p.add_argument("--strategies", default="ddp,fsdp,scratch,dp",
                   help="comma list of ddp, fsdp, tp, scratch, dp")
    p.add_argument("--scale-with-devices", action="store_true",
                   help="batch times the device count (as for sweep)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a preset key (repeatable)")
    p.add_argument("--measure-again", action="store_true",
                   help="measure every input again instead of using the kept figures")
    p.add_argument("--runs-dir", help="where the measuring runs are recorded (default: "
                                      "<cache>/predict-runs)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=cmd_predict)


def parse_strategies(text: str) -> list[str]:
    """The strategies to predict; ConfigError (one line) for one without a model."""
    from gputui.runs.predict.scaling import STRATEGIES

    items = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    items = [s for s in items if s != "single"]  # the one-device row is always there
    bad = [s for s in items if s not in STRATEGIES]
    if bad or not items:
        what = (f"{', '.join(map(repr, bad))} has no prediction" if bad
                else "no strategy that has a prediction")
        raise ConfigError(f"--strategies {text}: {what}; give some of {', '.join(STRATEGIES)}")
    return items


def predict_grid(cfg, counts: list[int], strategies: list[str], kind: str, runs_dir: Path,
                 line, again: bool = False, measure: bool = True,
                 sources: list | None = None,
                 warnings: list | None = None) -> list[dict[str, Any]]:
    """Prediction rows (dicts) for every count x strategy, the one-device row first, each
    with its ``flags`` (the trust rules: an impossible figure is no result); ``sources`` gets,
    per input, whether it was measured now or read from the cache; ``warnings`` a line when
    contention poisoned t_1, the baseline of every speedup."""
    from gputui.core.trust import poisoned
    from gputui.runs.predict.measure import Measurer
    from gputui.runs.predict.scaling import Prediction, impossible, predict

    m = Measurer(cfg, kind, runs_dir, line=line, measure=measure, again=again)
    rows = []
    for n in sorted(set(counts) | {1}):
        # what `gputui run` would refuse on n devices is no prediction, and not measured
        refused = {} if n == 1 else refusals(cfg, strategies, kind, n)
        inp = m.inputs(n, [s for s in strategies if s not in refused])
        one = m.baseline or {}
        for s in (["single"] if n == 1 else strategies):
            if s in refused:
                p = Prediction(strategy=s, n=n, batch=inp.batch,
                               reason=f"cannot run: {refused[s]}")
            else:
                p = predict(s, inp)
            if n == 1 and not inp.t_1:
                p.reason = "not measured: t_1"
            rows.append(dict(p.to_dict(), devices=n, step_ms=(p.step_time_s or 0) * 1000
                             if p.step_time_s else None,
                             flags=impossible(p, inp, m.cores, one.get("noise"))))
    if sources is not None:
        sources.extend(m.sources)
    why = poisoned(one.get("machine"), noise=one.get("noise"), threads=one.get("threads") or 0,
                   omp_wait=one.get("omp_wait") or "") if one else ""
    if why and warnings is not None:
        warnings.append(f"t_1, the one-device step every speedup divides by: "
                        f"{why.replace('rerun it', 'measure it again (--measure-again)')}")
    return rows


def refusals(cfg, strategies: list[str], kind: str, n: int) -> dict[str, str]:
    """The strategies ``gputui run`` would refuse with ``cfg`` on ``n`` devices of ``kind``,
    each with its reason (the check `gputui strategies` shows: pp on 1f1b with one
    micro-batch, say)."""
    from gputui.core.devices import Device, cpu_devices
    from gputui.plan import why_not

    devices = cpu_devices(n) if kind == "cpu" else [Device("cuda", i) for i in range(n)]
    out = {}
    for s in strategies:
        reason = why_not(cfg.replace(strategy={"name": s}), devices)
        if reason:
            out[s] = reason
    return out


def age_text(seconds: float | None) -> str:
    """"12 s", "5 min", "3.2 h", "2.0 days" (``?`` when not known)."""
    if seconds is None:
        return "age unknown"
    if seconds < 90:
        return f"{seconds:.0f} s old"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min old"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h old"
    return f"{seconds / 86400:.1f} days old"


def source_lines(sources: list[dict]) -> list[str]:
    """One line per input: measured now or cached (when, how old), and its load."""
    out = []
    for s in sources:
        when = "measured now" if s["source"] == "measured now" else \
            f"cached, measured {s['measured'] or '?'} ({age_text(s['age_s'])})"
        out.append(f"  {s['input']}: {when}" + (f"; {s['note']}" if s["note"] else ""))
    kinds = {s["source"] for s in sources}
    if len(kinds) > 1:
        out.append("  these inputs were measured at different moments: `--measure-again` "
                   "measures all of them in one sitting")
    return out


def counts_of(devices: list[str]) -> list[int]:
    """Device counts from sweep-style items (1,2 or cpu,cpu*2)."""
    out = []
    for item in devices:
        out.append(int(item) if item.isdigit() else 1 if item == "cpu" else int(item[4:]))
    return out


def cmd_predict(args) -> int:
    """``gputui predict``: measure what is missing, print the predicted table."""
    from gputui.cli.common import set_overrides
    from gputui.core.presets import resolve_preset
    from gputui.runs.prepare import load_base
    from gputui.runs.sweep.runner import parse_devices, resolve_kind

    try:
        path = str(resolve_preset(args.preset).resolve())
        counts = counts_of(parse_devices(args.devices))
        strategies = parse_strategies(args.strategies)
        cfg = load_base(path, set_overrides(args.sets, None))
        kind, _ = resolve_kind(args.kind, cfg.devices.spec)
        from gputui.runs.predict.scaling import unmodelled

        if unmodelled(cfg):
            raise ConfigError(str(unmodelled(cfg)))
    except (ConfigError, LookupError) as exc:
        return fail(str(exc))
    if args.scale_with_devices:
        cfg = cfg.replace(optim={"scale_with_devices": True})
    return print_prediction(cfg, counts, strategies, kind, args.runs_dir, args.json,
                            args.measure_again, Path(args.preset).stem)


def writable_problem(runs_dir: str | None) -> str | None:
    """Why predict could not keep what it measures, as one line naming the folder, or None:
    the measuring runs' folder (``--runs-dir``, else inside the cache) and the cache."""
    from gputui.core.filewrite import folder_problem
    from gputui.core.cachedir import cache_dir

    cache = folder_problem(cache_dir(), "the measure cache (GPUTUI_CACHE_DIR, XDG_CACHE_HOME "
                                        "or ~/.cache)")
    return (folder_problem(runs_dir, "--runs-dir") if runs_dir else None) or cache


def print_prediction(cfg, counts, strategies, kind, runs_dir, as_json: bool, again: bool,
                     title: str) -> int:
    """Measure, then print the table (or JSON on stdout; progress on stderr)."""
    from gputui.cli.output import emit
    from gputui.core.signals import Interrupted
    from gputui.runs.predict.scaling import FORMULAS
    from gputui.core.cachedir import cache_dir

    out = sys.stderr if as_json else sys.stdout
    where = Path(runs_dir) if runs_dir else cache_dir() / "predict-runs"
    problem = writable_problem(runs_dir)
    if problem:  # before any measuring run: its record or its figure would be lost
        return fail(problem)

    def line(text: str) -> None:
        print(text, file=out, flush=True)

    line(f"predicting {title} on {kind} devices {', '.join(map(str, counts))}: measuring what "
         f"this machine has not measured yet (kept in {cache_dir()})")
    try:
        sources: list[dict] = []
        warnings: list[str] = []
        rows = predict_grid(cfg, counts, strategies, kind, where, line, again,
                            sources=sources, warnings=warnings)
    except KeyboardInterrupt:
        print("prediction interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Interrupted as exc:  # the stop contract: the measuring stopped, nothing predicted
        from gputui.cli.common import interrupted

        return interrupted(exc.signum, f" while measuring: nothing predicted; the figures "
                                       f"measured before it are kept in {cache_dir()}")
    except RuntimeError as exc:
        print(f"gputui: prediction failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    shown = [dict(r, speedup="flagged", efficiency="flagged") if r.get("flags") else r
             for r in rows]  # as compare shows an impossible figure: the reason below
    emit(shown, COLUMNS, "json" if as_json else "table", None, f"predicted scaling: {title}",
         json_data={"rows": rows, "formulas": FORMULAS, "kind": kind, "inputs": sources,
                    "warnings": warnings})
    for text in flag_lines(rows) + [f"warning: {w}" for w in warnings]:
        line(text)
    line("inputs:")
    for text in source_lines(sources):
        line(text)
    return EXIT_OK


def flag_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per flagged prediction: the figure and why it is no result."""
    return [f"{r['strategy']} on {r['devices']}: FLAGGED, predicted speedup {r['speedup']:.2f}x "
            f"is not a result: {why}" for r in rows for why in r.get("flags") or []]
