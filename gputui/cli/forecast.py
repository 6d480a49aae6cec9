"""`gputui plan PRESET --gpus 8xH100 [--nodes N] [--set ...] [--json] [--png FILE]`: will it
fit, and how fast, on devices this machine does not have, for every mesh of their count
(``gputui.runs.forecast``); ``--check RUN``: a recorded run beside its plan; ``--write-preset
ROW FILE``: a row as a preset; ``--write-sbatch ROW FILE``: a row as a preset and an sbatch
script that runs it on the planned nodes. Progress on stderr; exit 0, 1 the tracing failed, 2
bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gputui.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from gputui.core.config import ConfigError

GIB = 2**30


def register(sub) -> None:
    """Add the `plan` subcommand."""
    p = sub.add_parser("plan", help="plan a GPT's memory and speed on GPUs you do not have",
                       description="For every mesh of the devices' count: memory per rank "
                                   "(traced on a fake process group under fake tensors, with "
                                   "the real model and parallelism code), whether it fits, "
                                   "step time, tokens/s, MFU and each collective's time, from "
                                   "device profiles (docs/planning.md).")
    p.add_argument("preset", nargs="?", help="a preset file or name (its [model], data.context, "
                                             "run.precision, optim.batch_size)")
    p.add_argument("--gpus",
                   help="devices: 8xH100, 2x8xH100 (nodes x per node), H200, cpu*4 (this "
                        "machine's CPU, measured); known: A100-40GB, A100-80GB, H100-SXM, "
                        "H100-PCIe, H200, L4, L40S, RTX4090, MI300X (default: 8xH100; "
                        "--check: the run's own)")
    p.add_argument("--nodes", type=int, default=1, help="machines of --gpus each")
    p.add_argument("--profile", help="a TOML file of device profiles (devices.toml's layout)")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   metavar="TABLE.KEY=VALUE", help="override a preset key (repeatable)")
    p.add_argument("--vocab", type=int, help="vocabulary size (default 256: gputui's bytes)")
    p.add_argument("--batch", type=int, help="sequences per step, all ranks together "
                                             "(default optim.batch_size)")
    p.add_argument("--local-batch", type=int,
                   help="sequences per step per data-parallel rank (instead of --batch)")
    p.add_argument("--efficiency", type=float,
                   help="share of the peak FLOP/s a step reaches (default: measured by the "
                        "newest kept run of this model on one such GPU, else the profile's "
                        "stated assumption)")
    p.add_argument("--all-meshes", action="store_true",
                   help="every dp_replicate x dp_shard split, not only ddp, fsdp and HSDP "
                        "inside a node")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--png", help="write the memory-against-speed view (Pareto front) here")
    p.add_argument("--check", metavar="RUN", help="a recorded run beside the plan of its mesh")
    p.add_argument("--write-preset", nargs=2, metavar=("ROW", "FILE"),
                   help="write row ROW (1 = the first of the table) as a preset file")
    p.add_argument("--write-sbatch", nargs=2, metavar=("ROW", "FILE"),
                   help="write row ROW as an sbatch script for the planned nodes (and its "
                        "preset beside it, FILE's name with .toml): `gputui slurm`'s script "
                        "for that preset, see docs/clusters.md")
    p.add_argument("--runs-dir", help="where --check finds RUN, where the plan looks for "
                                      "kept runs of the model on such a GPU, and the runs "
                                      "folder --write-sbatch's script records into")
    p.set_defaults(func=cmd_plan)


def _line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_plan(args) -> int:
    """``gputui plan``."""
    from gputui.core.signals import Interrupted

    try:
        if args.check:
            return _check(args)
        if not args.preset:
            return fail("gputui plan needs a PRESET (or --check RUN)")
        return _plan(args)
    except (ConfigError, LookupError) as exc:
        return fail(str(exc))
    except Interrupted as exc:
        from gputui.cli.common import interrupted

        return interrupted(exc.signum, ": the plan stopped; the meshes traced so far are kept "
                                       "for the next plan")
    except RuntimeError as exc:
        print(f"gputui: plan failed: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _plan(args) -> int:
    from gputui.cli.common import set_overrides
    from gputui.core.presets import resolve_preset
    from gputui.runs.forecast.planner import KeptRuns, cluster_of, make_plan, model_of
    from gputui.runs.prepare import load_base

    if args.nodes < 1:
        raise ConfigError("--nodes must be 1 or more")
    for flag, chosen in (("--write-preset", args.write_preset),
                         ("--write-sbatch", args.write_sbatch)):
        if chosen:
            try:
                int(chosen[0])
            except ValueError:
                raise ConfigError(f"{flag} {chosen[0]}: ROW is a row number of the table "
                                  f"(1 = the first)") from None
    if args.write_sbatch and Path(args.write_sbatch[1]).suffix == ".toml":
        raise ConfigError(f"--write-sbatch {args.write_sbatch[1]}: that is the preset's name "
                          f"beside the script; name the script itself (e.g. job.sh)")
    _writable(args)
    if args.efficiency is not None and not 0 < args.efficiency <= 1:
        raise ConfigError(f"--efficiency {args.efficiency}: give a share between 0 and 1")
    for flag, value in (("--vocab", args.vocab), ("--batch", args.batch),
                        ("--local-batch", args.local_batch)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be 1 or more")
    path = str(resolve_preset(args.preset).resolve())
    cfg = load_base(path, set_overrides(args.sets, None))
    model = model_of(cfg, args.vocab, args.batch, args.local_batch)
    eff = (args.efficiency, "given with --efficiency") if args.efficiency else None
    gpus = DEFAULT_GPUS if args.gpus is None else args.gpus
    cluster = cluster_of(gpus, args.nodes, args.profile, _line, eff,
                         KeptRuns(model, args.runs_dir, cfg.run.compile))
    _line(f"planning {Path(args.preset).stem} ({millions(model.params())} parameters) on "
          f"{cluster.describe()}")
    from gputui.runs.forecast.cells import row_line
    from gputui.runs.forecast.links import will_measure

    plan = make_plan(model, cluster, _line, args.all_meshes,
                     on_row=lambda row: _line(row_line(row, will_measure(row, cluster))))
    if not any(r.peak for r in plan.rows):
        return _nothing_planned(plan)
    if args.png:  # first: a reader of the table that closes it early (`| head`) loses no file
        from gputui.runs.forecast.planner import plot_pareto

        out = plot_pareto(plan, args.png)
        _line(f"memory against speed: {out}")
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print_plan(plan)
    code = EXIT_OK
    if args.write_preset:
        code = _write_preset(args, cfg, plan)
    if args.write_sbatch and code == EXIT_OK:
        code = _write_sbatch(args, cfg, plan)
    return code


DEFAULT_GPUS = "8xH100"


def _writable(args) -> None:
    """The files the plan is asked to write, checked before it traces: a folder that does
    not exist, or one this user cannot write in, is one line now, not after a minute's plan
    (ConfigError)."""
    import os

    for flag, path in (("--png", args.png),
                       ("--write-preset", (args.write_preset or [None, None])[1]),
                       ("--write-sbatch", (args.write_sbatch or [None, None])[1])):
        if not path:
            continue
        folder = Path(path).expanduser().absolute().parent
        if not folder.is_dir():
            raise ConfigError(f"{flag} {path}: the folder {folder} does not exist; create it "
                              f"or name a file in an existing one")
        if not os.access(folder, os.W_OK):
            raise ConfigError(f"{flag} {path}: this user cannot write in {folder}")


def millions(n: int) -> str:
    """'124M', '0.83M': whole millions from 10M, two decimals below (no '1M' for 0.83M)."""
    return f"{n / 1e6:,.0f}M" if n >= 1e7 else f"{n / 1e6:.2f}M"


def _nothing_planned(plan) -> int:
    """No mesh has figures: the model and batch make none of the devices' count (bad input,
    exit 2: what would make one), or every trace failed (exit 1, the first one's error)."""
    from gputui.runs.forecast.estimate import label_of

    where = plan.cluster.describe()
    for r in plan.rows:
        _line(f"  not planned: {label_of(r.shape)}: {r.reason}")
    skipped = all(r.skipped for r in plan.rows)
    # the reasons of that kind: every mesh's where none is one; else the traces' errors
    reasons = [r.reason for r in plan.rows if r.reason and (skipped or not r.skipped)]
    first = reasons[0] if reasons else "no mesh of that many devices"
    more = f" (and {len(reasons) - 1} more meshes, each said above)" if len(reasons) > 1 else ""
    if skipped:
        return fail(f"no mesh of {where} can train this: {first}{more}; change the device "
                    f"count, --batch or --local-batch")
    print(f"gputui: plan failed: no mesh of {where} was traced: {first}{more}",
          file=sys.stderr)
    return EXIT_FAILED


def _row(flag: str, chosen: list[str], plan):
    """Row ``chosen[0]`` (1 = the first with figures), or None after its one-line error."""
    n = int(chosen[0])
    rows = [r for r in plan.rows if r.peak]
    if not 1 <= n <= len(rows):
        fail(f"{flag} {n}: the table has rows 1 to {len(rows)}")
        return None
    return rows[n - 1]


def _write_preset(args, cfg, plan) -> int:
    from gputui.core.filewrite import write_atomic
    from gputui.runs.forecast.planner import preset_text

    row = _row("--write-preset", args.write_preset, plan)
    if row is None:
        return EXIT_USAGE
    write_atomic(Path(args.write_preset[1]), preset_text(Path(args.preset).stem, cfg, row,
                                                         plan.cluster))
    _line(f"row {args.write_preset[0]} ({row.shape.describe()}) written as a preset: "
          f"{args.write_preset[1]}")
    return EXIT_OK


def _write_sbatch(args, cfg, plan) -> int:
    """The row's preset beside an sbatch script that runs it on the planned nodes (one gputui
    a node, as `gputui slurm` writes it)."""
    from gputui.cli.slurm import write_script
    from gputui.core import slurm
    from gputui.core.filewrite import WriteFailed, write_atomic
    from gputui.core.runstore import default_runs_dir
    from gputui.runs.forecast.planner import preset_text

    row = _row("--write-sbatch", args.write_sbatch, plan)
    if row is None:
        return EXIT_USAGE
    script = Path(args.write_sbatch[1])
    preset = script.with_suffix(".toml")
    cluster = plan.cluster
    gpus = cluster.per_node if cluster.profile.kind == "gpu" else 0
    text = slurm.sbatch_script(str(preset.resolve()), cfg.run.name, cluster.nodes, gpus,
                               f"{sys.executable} -m gputui",
                               str(Path(args.runs_dir or default_runs_dir()).absolute()), [])
    try:
        write_atomic(preset, preset_text(Path(args.preset).stem, cfg, row, cluster))
    except WriteFailed as exc:  # its text names the path: "cannot write PATH: why"
        return fail(str(exc))
    problem = write_script(script, text)
    if problem:
        return fail(problem)
    _line(f"row {args.write_sbatch[0]} ({row.shape.describe()}) written as {preset} and the "
          f"sbatch script {script} ({cluster.nodes} node(s)"
          + (f" of {gpus} GPU(s)" if gpus else ", CPU ranks") + f"): submit it with "
          f"`sbatch {script}`")
    return EXIT_OK


def _gib(n: int | None) -> str:
    return f"{n / GIB:.2f}" if n else "-"


def seconds(s: float | None) -> str:
    """A duration as the plan shows it (the app's plan screen too: forecast.cells)."""
    from gputui.runs.forecast.cells import seconds as text

    return text(s)


def print_plan(plan) -> None:
    """The table (rows that fit, fastest first), the collectives of the best, the assumptions."""
    from rich.console import Console
    from rich.table import Table

    from gputui.runs.forecast.cells import origin
    from gputui.runs.forecast.estimate import label_of, pareto

    console = Console(width=None if sys.stdout.isatty() else 200)
    m = plan.model
    moe = (f", {m.active_params() / 1e6:,.1f}M active: {m.moe_experts} experts top-"
           f"{m.moe_top_k}" if m.moe_experts else "")
    table = Table(title=f"plan: {millions(m.params())}-parameter GPT{moe} (n_layer {m.n_layer}, "
                        f"n_embd {m.n_embd}, context {m.context}, vocab {m.vocab}, "
                        f"{m.precision}, batch {m.batch}{' per dp rank' if m.local_batch else ''}"
                        f") on {plan.cluster.describe()}; memory in GiB per rank")
    cols = ("#", "strategy", "mesh", "zero", "ac", "params", "grads", "optim", "act",
            "temp+buf", "peak", "fits", "step", "tok/s", "MFU", "comm")
    for c in cols:
        table.add_column(c, justify="left" if c in ("strategy", "mesh", "ac") else "right",
                         no_wrap=True)
    front = {id(r) for r in pareto(plan.rows)}
    notes = []
    for i, r in enumerate((r for r in plan.rows if r.peak), 1):
        mem = r.mem
        if r.reason:
            notes.append(f"  {i}: {r.reason}")
        table.add_row(str(i) + ("*" if id(r) in front else ""), r.strategy, r.shape.describe(),
                      str(r.shape.zero) if r.shape.dp_shard > 1 else "-", r.shape.ac,
                      _gib(mem["params"] + mem["gathered"]), _gib(mem["grads"]),
                      _gib(mem["optim"]), _gib(mem["activations"]),
                      _gib(mem["temps"] + mem["buffers"]), _gib(r.peak),
                      "yes" if r.fits else "no",
                      seconds(r.step_s) if r.step_s else "-",
                      f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-",
                      f"{r.mfu:.0%}" if r.mfu else "-", seconds(r.comm_exposed_s))
    console.print(table)
    console.print("* the Pareto front (no other mesh that fits is both smaller and faster); "
                  "comm: the collectives' time the step waits for")
    if notes:
        console.print("rows that do not fit, and why:")
    for text in notes:
        console.print(text, soft_wrap=True)
    formulas = sorted({f for r in plan.rows for f in r.formula})
    if formulas:
        console.print("not traced but computed (formulas):")
        for f in formulas:
            console.print(f"  {f}", soft_wrap=True)
    skipped = [r for r in plan.rows if not r.peak]
    for r in skipped:
        _line(f"  not planned: {label_of(r.shape)}: {r.reason}")
    best = next((r for r in plan.rows if r.fits and r.step_s), None)
    if best is not None and best.comm:
        console.print(f"collectives of row 1 ({best.shape.describe()}), per step and rank:")
        for c in best.comm:
            mark = origin(c)
            console.print(f"  {c['kind']:>14} {c['phase']:<9} group {c['group']:>3}: "
                          f"{c['count']:>4} calls, {c['bytes'] / 2**20:,.1f} MiB, "
                          f"{seconds(c['seconds'])}{mark}")
    console.print("assumptions:")
    for a in plan.assumptions:
        console.print(f"  {a}")


def _check(args) -> int:
    from gputui.runs.forecast.planner import check_run
    from gputui.runs.history import find_run

    if args.gpus is not None or args.nodes != 1:
        raise ConfigError("--check plans the run's own devices, as its record has them: leave "
                          "out --gpus and --nodes")
    given = [flag for flag, value in (
        ("a PRESET", args.preset), ("--set", args.sets), ("--vocab", args.vocab),
        ("--batch", args.batch), ("--local-batch", args.local_batch),
        ("--efficiency", args.efficiency), ("--all-meshes", args.all_meshes),
        ("--png", args.png), ("--write-preset", args.write_preset),
        ("--write-sbatch", args.write_sbatch)) if value]
    if given:
        raise ConfigError(f"--check plans the run as its record has it: leave out "
                          f"{', '.join(given)} (or plan the preset without --check)")
    run_dir = find_run(args.check, args.runs_dir)
    got = check_run(run_dir, _line, args.profile)
    if args.json:
        print(json.dumps(got, indent=2))
    else:
        print_check(got)
    return EXIT_OK


def print_check(got: dict[str, Any]) -> None:
    """``--check``'s table: the plan of a recorded run's mesh beside its record, per part."""
    p, m = got["planned"], got["measured"]
    print(f"run {got['run']} (mesh {got['mesh']}): planned against recorded, per rank")
    print(f"  {'':<12} {'planned':>12} {'recorded':>12} {'ratio':>7}")
    pairs: list[tuple[str, Any, Any]] = [
        (k, p["mem"].get(k), m["mem"].get(k)) for k in ("params", "grads", "optim",
                                                        "activations")]
    if m.get("peak"):  # a GPU record: the CUDA allocator's peak
        pairs.append(("peak", p["peak"], m["peak"]))
    pairs.append(("step s", p["step_s"], m["step_s"]))
    for name, a, b in pairs:
        ratio = f"{a / b:.2f}" if a and b else "-"
        fa = (f"{a / 2**20:.2f} MiB" if name != "step s" else f"{a:.4f}") if a else "-"
        fb = (f"{b / 2**20:.2f} MiB" if name != "step s" else f"{b:.4f}") if b else "-"
        print(f"  {name:<12} {fa:>12} {fb:>12} {ratio:>7}")
    if not m.get("peak"):
        print(f"  planned peak {p['peak'] / 2**20:.2f} MiB (a CPU record has no allocator peak)")
