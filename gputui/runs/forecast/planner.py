"""One plan end to end (torch-free): the cluster's profile, the meshes traced (once each, kept),
a second round with full activation checkpointing for the meshes whose activations do not
fit, a third with selective for those that fit with full,
the rows in order; ``--check``: a recorded run beside what the plan says for it; a chosen
row as a preset."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from gputui.core.config import ConfigError, RunConfig
from gputui.core.mesh import MeshShape
from gputui.runs.forecast import estimate, links, profiles
from gputui.runs.compare.export import _pyplot, _save
from gputui.runs.forecast.estimate import GIB, Candidate, ModelSize, Row
from gputui.runs.forecast.profiles import Cluster, Profile
from gputui.runs.forecast.tracing import Tracer, job_key, run_jobs
from gputui.core import runstore
from gputui.core.config import load_preset
from gputui.core.events import FlopsInfo, MemoryReport, RunStarted
from gputui.core.mesh import mesh_of
from gputui.runs.predict.cache import cores, machine_id
from gputui.runs.predict.comm_peak import kept

Line = Callable[[str], None]
OnRow = Callable[[Row], None]
TEXT_VOCAB = 256  # gputui's text data is bytes
CP_TRACED = ("cp: gputui's ring attention traced on the fake group (zig-zag split, keys and "
             "values sent round the ring; its hops counted in line with the compute); a CUDA "
             "run takes PyTorch's context_parallel where its torch has it, not traced")


def moe_assumption(model: ModelSize) -> str:
    """What a mixture of experts' plan assumed, in one line."""
    return (f"mixture of experts ({model.moe_experts} experts, top-{model.moe_top_k}, capacity "
            f"factor {model.moe_capacity_factor:g}): fake tensors have no router values, so "
            f"each rank's tokens are routed evenly over the experts and kept by the capacity "
            f"rule (every assignment at a factor of 1 or more); a real router's imbalance "
            f"moves tokens between ep ranks. FLOPs and MFU are of the "
            f"{model.active_params() / 1e6:,.2f}M active parameters ({model.params() / 1e6:,.2f}M "
            f"in all); meshes with tp, pp or cp not planned (the runs take none with it)")


@dataclass
class Plan:
    """A plan's rows (in order), the cluster, the model and what it assumed."""

    cluster: Cluster
    model: ModelSize
    rows: list[Row]
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        p = self.cluster.profile
        return {"cluster": self.cluster.describe(), "world": self.cluster.world,
                "profile": {"name": p.name, "memory_gib": p.memory_gib, "tflops": p.tflops,
                            "link_gbs": p.link_gbs, "net_gbs": p.net_gbs,
                            "efficiency": p.efficiency, "source": p.source},
                "model": {"n_layer": self.model.n_layer, "n_embd": self.model.n_embd,
                          "n_head": self.model.n_head, "context": self.model.context,
                          "vocab": self.model.vocab, "params": self.model.params(),
                          "active_params": self.model.active_params(),
                          "moe_experts": self.model.moe_experts,
                          "precision": self.model.precision},
                "rows": [r.to_dict() for r in self.rows],
                "pareto": [estimate.label_of(r.shape) for r in estimate.pareto(self.rows)],
                "assumptions": self.assumptions}


def model_of(cfg: RunConfig, vocab: int | None, batch: int | None,
             local_batch: int | None) -> ModelSize:
    """The GPT a config trains (its [model], data.context, run.precision, the batch)."""
    if cfg.model.factory or cfg.model.name != "gpt":
        raise ConfigError(f"gputui plan traces the built-in GPT (model.name = 'gpt'); this "
                          f"preset trains {cfg.model.factory or cfg.model.name!r}")
    global_batch = batch or cfg.optim.batch_size
    return ModelSize(n_layer=cfg.model.n_layer, n_embd=cfg.model.n_embd,
                     n_head=cfg.model.n_head, context=cfg.data.context,
                     vocab=vocab or TEXT_VOCAB, tie=cfg.model.tie,
                     batch=local_batch or global_batch, local_batch=bool(local_batch),
                     precision=cfg.run.precision,
                     chunks=cfg.optim.micro_batches,
                     pipeline_chunks=cfg.strategy.pipeline_chunks,
                     schedule=cfg.strategy.schedule,
                     stages_per_rank=cfg.strategy.stages_per_rank,
                     moe_experts=cfg.model.moe_experts, moe_top_k=cfg.model.moe_top_k,
                     moe_capacity_factor=cfg.model.moe_capacity_factor,
                     moe_aux_weight=cfg.model.moe_aux_weight)


@dataclass(frozen=True)
class KeptRuns:
    """Where a plan looks for a kept run of its model (:func:`measured_efficiency`)."""

    model: ModelSize
    runs_dir: str | Path | None
    compile_mode: str | None


def cluster_of(gpus: str, nodes: int, profile_file: str | None, line: Line,
               efficiency: tuple[float, str] | None = None,
               kept: KeptRuns | None = None) -> Cluster:
    """The cluster ``--gpus`` names; the CPU's profile is measured here (a child). The
    compute efficiency: ``efficiency`` where given, else the one a kept run measured
    (``kept``, where one is found), else the profile's."""
    known = profiles.load_profiles(profile_file)
    name, per, n_nodes = profiles.parse_gpus(gpus, nodes, known)
    if name == "cpu":
        p = _cpu(per, line)
    else:
        p = profiles.find(known, name)
    if efficiency is None and kept is not None:
        efficiency = measured_efficiency(p, kept.model, kept.runs_dir, kept.compile_mode, known)
    if efficiency:
        p = profiles.with_efficiency(p, efficiency[0], efficiency[1])
    return Cluster(p, per, n_nodes)


def measured_efficiency(profile: Profile, model: ModelSize, runs_dir: str | Path | None = None,
                        compile_mode: str | None = None,
                        known: dict[str, Profile] | None = None) -> tuple[float, str] | None:
    """The compute efficiency a kept record measured for ``model`` on one device of
    ``profile``'s kind (its FLOPs per step over its steady step time and the profile's peak
    for the model's dtype): the newest finished single-device run of the same GPT (layers,
    width, heads, context, experts, precision), without activation checkpointing (a run's
    FLOPs leave the recomputation out, a plan's count it), with ``compile_mode`` where given,
    on a GPU whose name finds this profile among all of them (``known``; the listed ones by
    default). None where there is none (a CPU profile measures its own peak and takes
    none)."""
    if profile.kind != "gpu":
        return None
    known = known or profiles.load_profiles()
    same = ("n_layer", "n_embd", "n_head", "context", "tie", "precision", "moe_experts",
            "moe_top_k")
    dtype = model.dtype()
    peak = profile.peak_flops(dtype)
    if peak <= 0:
        return None
    try:
        runs = runstore.list_runs(runs_dir)  # newest first
    except OSError:  # an optional lookup: a folder that cannot be listed has none
        return None
    for run_dir, summary in runs:
        steady = summary.steady
        if (summary.status.value != "finished" or summary.world_size != 1 or steady is None
                or steady.step_time_s <= 0):
            continue
        try:
            cfg = load_preset(run_dir / "config.toml")
            kept = model_of(cfg, model.vocab, None, None)
        except (ConfigError, OSError, ValueError):
            continue
        if (any(getattr(kept, k) != getattr(model, k) for k in same)
                or cfg.parallel.ac != "none"
                or (compile_mode is not None and cfg.run.compile != compile_mode)):
            continue
        try:  # the events only of a record of the same model
            events = runstore.read_events(run_dir)
        except (OSError, ValueError):
            continue
        started = next((e for e in events if isinstance(e, RunStarted)), None)
        flops = next((e for e in events if isinstance(e, FlopsInfo)), None)
        if (started is None or flops is None or flops.flops_per_step <= 0
                or flops.dtype != dtype):
            continue
        devices = [d for d in started.devices if d.get("kind") == "cuda"]
        if len(devices) != 1:
            continue
        label = str(devices[0].get("label") or "")
        try:
            if profiles.for_device(known, label).name != profile.name:
                continue
        except ConfigError:
            continue
        eff = flops.flops_per_step / (steady.step_time_s * peak)
        if not 0 < eff <= 1:
            continue
        compiled = "compiled" if cfg.run.compile != "off" else "eager"
        return eff, (f"measured: run {run_dir.name} (this GPT, {cfg.run.precision}, {compiled}, "
                     f"batch {cfg.optim.batch_size}, on one {label}: {steady.steps} steady "
                     f"steps of {steady.step_time_s * 1000:.1f} ms)")
    return None


def _cpu(ranks: int, line: Line) -> Profile:
    import psutil

    n = cores()
    threads = max(1, n // ranks)
    spec = {"threads": threads, "dtype": "fp32", "ops": ops_spec(threads)}
    got = run_jobs([{"kind": "cpu_profile", "spec": spec,
                     "label": f"measuring this CPU's matmul peak and an operation's dispatch "
                              f"at {threads} thread(s)"}], line)[job_key("cpu_profile", spec)]
    if "error" in got:
        raise RuntimeError(f"measuring this CPU's peak failed: {got['error']}")
    per_op = got.get("ops") or {"error": "not measured"}
    comm = kept("cpu", ranks, "gloo") if ranks > 1 else None
    p = profiles.cpu_profile(float(got["flops"]), n, psutil.virtual_memory().total, comm,
                             ranks, None if "error" in per_op else per_op)
    if "error" in per_op:
        line(f"measuring an operation's dispatch failed ({per_op['error']}): the plan prices "
             f"FLOPs only")
        p = replace(p, ops_source=f"not priced: measuring it failed ({per_op['error']})")
    return p


# the GPT whose steps measure an operation's dispatch: so small that a step is nearly all
# dispatch (n_embd 8, context 8, one sequence)
TINY = ModelSize(n_layer=4, n_embd=8, n_head=2, context=8, vocab=TEXT_VOCAB, batch=1,
                 precision="fp32", chunks=1, schedule="1f1b")


def ops_spec(threads: int) -> dict[str, Any]:
    """The job measuring this machine's cost of an operation's dispatch (kept per machine):
    :data:`TINY` on one rank and on tp 2 (gputui.train.plan_trace._cpu_ops)."""
    return {"threads": threads, "machine": machine_id(), "tries": 3, "bytes": profiles.BYTE_PROBE,
            "plain": estimate.spec_of(TINY, MeshShape(), 1),
            "dtensor": estimate.spec_of(TINY, MeshShape(tp=2), 2)}


def make_plan(model: ModelSize, cluster: Cluster, line: Line, every_mesh: bool = False,
              only: list[MeshShape] | None = None, on_row: OnRow | None = None) -> Plan:
    """Trace what is not kept, then the rows: every candidate at ac = none; those whose
    activations keep them from fitting (and whose state alone fits) again at full
    checkpointing, and those that fit so at selective checkpointing. ``on_row``: told each
    mesh's row as soon as its figures are in (kept ones at once, traced ones as each is
    traced), before the plan is whole: a CPU plan's collectives are measured after the last
    (:func:`links.measured`), so its rows' step times are the ring formula's until then."""
    cands = ([_cand(model, s, cluster) for s in only] if only is not None
             else estimate.candidates(model, cluster, "none", every_mesh))
    with Tracer(line) as tracer:  # its rounds' children sized by the load as the plan began
        rows = _rounds(cands, model, cluster, line, tracer, only is None, on_row)
    in_step = links.measured(rows, cluster, line)  # this machine's CPU ranks: measured
    p = cluster.profile
    assumptions = [
        f"device: {p.name}, {p.memory_gib:.1f} GiB, {p.peak_flops(model.dtype()) / 1e12:.1f} "
        f"TFLOP/s {model.dtype()} ({p.source})",
        f"compute efficiency {p.efficiency:.2f} of the peak: {p.efficiency_source}",
        (f"links: {links.SOURCE}" if in_step else
         f"links: {p.link_gbs:g} GB/s inside a node, {p.net_gbs:g} GB/s between nodes "
         f"({p.link_source}; {p.net_source or 'network: ' + p.link_source})"),
        f"fits: peak x {1 + profiles.ALLOCATOR_HEADROOM:.2f} (allocator headroom)"
        + (f" + {profiles.CUDA_CONTEXT_GIB:g} GiB (CUDA context)" if p.kind == "gpu" else "")
        + f" <= {p.memory_gib:.1f} GiB"]
    if p.op_s or p.dtensor_op_s:
        assumptions.append(f"host: {p.op_s * 1e6:.1f} us an operation on plain tensors, "
                           f"{p.dtensor_op_s * 1e6:.1f} us on DTensors, times the traced "
                           f"step's operations, and {p.byte_s * 2**20 * 1e3:.2f} ms a "
                           f"MiB written by those without a FLOP formula ({p.ops_source})")
    elif p.ops_source:  # a CPU whose cost of an operation could not be measured
        assumptions.append(f"host: the operations' dispatch {p.ops_source}")
    if any(r.shape.cp > 1 for r in rows):
        assumptions.append(CP_TRACED)
    if model.moe_experts:
        assumptions.append(moe_assumption(model))
    return Plan(cluster, model, estimate.order(rows), assumptions)


def _rounds(cands: list[Candidate], model: ModelSize, cluster: Cluster, line: Line,
            tracer: Tracer, checkpointing: bool, on_row: OnRow | None = None) -> list[Row]:
    rows = _rows(cands, model, cluster, line, tracer, on_row)
    if not checkpointing:
        return rows
    # full checkpointing keeps the least: tried first where checkpointing may make a mesh
    # fit, selective (faster, more memory) only where full fits
    again = [_cand(model, replace(r.shape, ac="full"), cluster) for r in rows
             if estimate.ac_may_fit(r, cluster.profile)]
    if again:
        line(f"{len(again)} mesh(es) do not fit for their activations: tracing them again "
             f"with full activation checkpointing (not those whose parameters, gradients "
             f"and optimizer state alone do not fit)")
        full = _rows(again, model, cluster, line, tracer, on_row)
        rows += full
        sel = [_cand(model, replace(r.shape, ac="selective"), cluster) for r in full
               if r.fits]
        if sel:
            line(f"{len(sel)} of them fit with full checkpointing: tracing them with "
                 f"selective checkpointing")
            rows += _rows(sel, model, cluster, line, tracer, on_row)
    return rows


def _cand(model: ModelSize, shape: MeshShape, cluster: Cluster) -> Candidate:
    spec = estimate.spec_of(model, shape, cluster.world, cluster.profile.kind == "gpu")
    return Candidate(shape, spec, "") if isinstance(spec, dict) else Candidate(shape, None, spec)


def _rows(cands: list[Candidate], model: ModelSize, cluster: Cluster, line: Line,
          tracer: Tracer | None = None, on_row: OnRow | None = None) -> list[Row]:
    jobs = [{"kind": "trace", "spec": c.spec, "label": f"tracing {c.label()}"}
            for c in cands if c.spec is not None]
    by_key = {job_key("trace", c.spec): c for c in cands if c.spec is not None}

    def each(key: str, figures: dict) -> None:  # a mesh's row as soon as it is traced
        # a row of its own (made again below for the plan): links.measured rewrites the
        # plan's rows' steps later, and the row told here is the app's thread's to read
        c = by_key.get(key)
        if c is not None and on_row is not None and "error" not in figures:
            on_row(estimate.make_row(c, figures, model, cluster))

    got = (run_jobs(jobs, line, tracer=tracer, on_result=each if on_row else None)
           if jobs else {})
    return [estimate.make_row(c, got.get(job_key("trace", c.spec)) if c.spec else None, model,
                              cluster) for c in cands]


# ---------------------------------------------------------------- --check RUN
def shape_of_run(cfg: RunConfig, world: int) -> MeshShape:
    return mesh_of(cfg, world)


def check_run(run_dir: Path, line: Line, profile_file: str | None = None) -> dict[str, Any]:
    """A recorded run beside the plan of its own mesh on its own devices: per-rank memory by
    part (the record's memory report) and the steady step time."""
    cfg = load_preset(run_dir / "config.toml")
    summary = runstore.read_summary(run_dir)
    events = runstore.read_events(run_dir)
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    if started is None:
        raise ConfigError(f"{run_dir}: the record has no run_started event to plan for")
    devices = list(started.devices)
    world = max(1, int(started.world_size))
    if all(d.get("kind") == "cpu" for d in devices):
        gpus = f"cpu*{world}"
    else:  # the profile of the record's GPU, by the name CUDA gave it
        known = profiles.load_profiles(profile_file)
        named = {profiles.for_device(known, str(d.get("label") or d.get("name"))).name
                 for d in devices}
        if len(named) != 1:
            raise ConfigError(f"{run_dir}: the run's devices are of {len(named)} kinds "
                              f"({', '.join(sorted(named))}); a plan is for one kind")
        gpus = f"{world}x{named.pop()}"
    cluster = cluster_of(gpus, 1, profile_file, line)
    model = model_of(cfg, TEXT_VOCAB, None, None)
    shape = shape_of_run(cfg, world)
    plan = make_plan(model, cluster, line, only=[shape])
    row = plan.rows[0]
    reports = [e for e in events if isinstance(e, MemoryReport) and e.per_device]
    measured = reports[0].per_device[0].to_dict() if reports else {}
    # the CUDA allocator's peak (rank 0's device; a CPU record has none), over every epoch
    peaks = [r.per_device[0].peak for r in reports if r.per_device[0].peak]
    steady = summary.steady
    return {"run": run_dir.name, "mesh": shape.describe(), "planned": row.to_dict(),
            "measured": {"mem": {k: measured.get(k) for k in ("params", "grads", "optim",
                                                              "activations")},
                         "peak": max(peaks) if peaks else None,
                         "step_s": steady.step_time_s if steady else None},
            "plan": plan.to_dict()}


# ---------------------------------------------------------------- a row as a preset
def preset_text(source: str, cfg: RunConfig, row: Row, cluster: Cluster) -> str:
    """The preset ``cfg`` becomes with ``row``'s mesh: strategy 'mesh', its degrees and levers
    (a TOML file: the source preset's settings with those changed)."""
    s = row.shape
    new = cfg.replace(strategy={"name": "mesh"},
                      parallel={"pp": s.pp, "dp_replicate": s.dp_replicate,
                                "dp_shard": s.dp_shard, "tp": s.tp, "cp": s.cp, "ep": s.ep,
                                "zero": s.zero, "ac": s.ac},
                      devices={"spec": "cpu*%d" % cluster.per_node
                               if cluster.profile.kind == "cpu" else "all"})
    if cluster.nodes > 1:
        new = new.replace(dist={"nnodes": cluster.nodes})
    head = (f"# From `gputui plan {source} --gpus {cluster.describe()}`: mesh {s.describe()}"
            f"{', ' + s.levers() if s.levers() else ''}; planned peak "
            f"{row.peak / 2**30:.2f} GiB per rank, step {row.step_s or 0:.3f} s\n")
    return head + new.to_toml()


def plot_pareto(plan: Plan, path: str | Path) -> Path:
    """The plan's memory-against-speed view as a PNG at ``path`` (returned): every mesh that
    fits (peak GiB per rank against tokens/s), the Pareto front joined, the device's usable
    memory as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in plan.rows if r.peak and r.tokens_per_s]
    for fits, colour, label in ((True, "tab:blue", "fits"), (False, "lightgrey", "does not fit")):
        pts = [r for r in rows if r.fits == fits]
        ax.scatter([r.peak / GIB for r in pts], [r.tokens_per_s for r in pts], c=colour,
                   label=label, s=18)
    front = estimate.pareto(plan.rows)
    ax.plot([r.peak / GIB for r in front], [r.tokens_per_s for r in front], "-o",
            color="tab:red", label="Pareto front")
    for r in front:
        ax.annotate(estimate.label_of(r.shape).replace(" zero", "\nzero", 1),
                    (r.peak / GIB, r.tokens_per_s or 0), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    ax.axvline(plan.cluster.profile.usable() / GIB, color="grey", linestyle="--",
               label="usable memory")
    ax.set_xlabel("planned peak memory per rank (GiB)")
    ax.set_ylabel("planned tokens/s (all ranks)")
    ax.set_title(f"plan on {plan.cluster.describe()}")
    ax.legend(fontsize=8)
    return _save(fig, plt, Path(path))
