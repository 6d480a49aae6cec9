"""From traced figures to a plan (torch-free): the meshes worth tracing for a cluster, and
each one's row: memory per rank and whether it fits, step time, tokens/s, MFU, every
collective's bytes and time, the reason beside a mesh that does not fit.

The time of a step, per rank (every input named in the row's ``assumptions``):

- compute: the rank's FLOPs (torch's counter on the traced step) over the profile's peak for
  the step's dtype times its efficiency (measured from a recorded step where one is given,
  else the stated default); a pipeline stage's compute grows by its schedule's bubble
  ((chunks + pp - 1) / chunks for gpipe and 1f1b, (pp - 1) / stages_per_rank fewer for the
  looped ones, none counted for the zero-bubble ones; CPU ranks sharing cores: the cores'
  work where that is longer, since a rank waiting in the bubble leaves its core to others);
- the host: the traced step's operations (plain and on DTensors) times the cost of each's
  dispatch, measured on this machine for a CPU profile (a DTensor op costs about ten
  plain ones here: tensor parallelism's rank computes half the FLOPs of one rank but not in half
  the time); not priced on a GPU, whose host queues kernels ahead of the device;
- each collective: a ring over its group, ``latency x steps + bytes x factor / bandwidth``
  (all-reduce 2 (n-1)/n, all-gather and reduce-scatter (n-1)/n), the bandwidth of the link the
  group spans (inside one node or across nodes, from the mesh's layout: tp innermost);
- exposed: tensor parallelism's all-reduces and pipeline sends wait in line with compute;
  data-parallel collectives overlap the compute on a GPU (all but what exceeds it, and at
  least one unit's worth) and not at all on the CPU (gloo runs on the cores that compute).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gputui.core.mesh import (PP_PLACEMENT, ZERO_BUBBLE, MeshShape, cp_context_problem, meshes,
                              stages_per_rank)
from gputui.runs.forecast.profiles import Cluster, Profile

GIB = 2**30
LATER_DIMS = ("cp", "ep")  # degrees that joined later: left out of a spec's key at 1
RING = "cp ring send"  # context parallelism's hops (gputui.train.plan_trace.RING)
MEM_PARTS = ("params", "gathered", "grads", "optim", "activations", "temps", "buffers")


@dataclass(frozen=True)
class ModelSize:
    """The GPT a plan is for, and how it trains: its size, the batch and the precision."""

    n_layer: int
    n_embd: int
    n_head: int
    context: int
    vocab: int
    tie: bool = True
    batch: int = 8  # sequences per step (global), or per data-parallel rank with local_batch
    local_batch: bool = False
    precision: str = "bf16"
    chunks: int = 1  # optim.micro_batches (gradient accumulation)
    pipeline_chunks: int = 1  # pp: micro-batches through the stages (strategy.pipeline_chunks)
    schedule: str = "1f1b"
    stages_per_rank: int = 2
    # a mixture of experts in place of each block's MLP (model.moe_*; 0: dense)
    moe_experts: int = 0
    moe_top_k: int = 1
    moe_capacity_factor: float = 1.25
    moe_aux_weight: float = 0.01

    def params(self) -> int:
        """Every parameter (a mixture of experts: all its experts)."""
        return self._params(self.moe_experts)

    def active_params(self) -> int:
        """The parameters one token uses (a mixture of experts: top_k experts a layer and the
        router; dense: all of them): what the counted FLOPs are the work of."""
        return self._params(self.moe_top_k) if self.moe_experts else self.params()

    def _params(self, experts: int) -> int:
        e, v = self.n_embd, self.vocab
        mlp = 8 * e * e + 5 * e
        block = 12 * e * e + 13 * e
        if self.moe_experts:  # the router (no bias) and the experts in place of the MLP
            block += e * self.moe_experts + (experts - 1) * mlp
        return self.n_layer * block + v * e + self.context * e + 2 * e + (0 if self.tie else v * e)

    def global_batch(self, dp: int) -> int:
        return self.batch * dp if self.local_batch else self.batch

    def dtype(self) -> str:
        return self.precision if self.precision in ("bf16", "fp16") else "fp32"


def label_of(shape: MeshShape) -> str:
    """A mesh in words with its memory levers: 'dp_shard 8 zero 3', 'tp 2 ac full'."""
    levers = [f"zero {shape.zero}" if shape.dp_shard > 1 else "",
              f"ac {shape.ac}" if shape.ac != "none" else ""]
    return " ".join([shape.describe(), *[x for x in levers if x]])


@dataclass
class Candidate:
    """A mesh to trace (or the reason it is not one), with the job that traces it."""

    shape: MeshShape
    spec: dict[str, Any] | None
    skip: str = ""

    def label(self) -> str:
        return label_of(self.shape)


def strategy_name(shape: MeshShape) -> str:
    """The named strategy a mesh is, else 'mesh'."""
    dims = {d for d, n in shape.dims() if n > 1}
    names = {frozenset({"dp_replicate"}): "ddp", frozenset({"dp_shard"}): "fsdp",
             frozenset({"tp"}): "tp", frozenset({"pp"}): "pp", frozenset({"cp"}): "cp",
             frozenset({"dp_shard", "tp"}): "fsdp_tp", frozenset(): "fsdp"}
    return names.get(frozenset(dims), "mesh")


def spec_of(model: ModelSize, shape: MeshShape, world: int,
            foreach: bool = False) -> dict[str, Any] | str:
    """The tracer's job for ``shape`` (see gputui.train.plan_trace), or why there is none.
    ``foreach``: AdamW's multi-tensor update, which torch takes by default on CUDA (a GPU
    profile's plan; a CPU run takes the per-tensor one)."""
    if model.n_head % shape.tp:
        return f"n_head {model.n_head} does not split over tp {shape.tp}"
    why = _cp_ep_problem(model, shape)
    if why:
        return why
    chunks = model.chunks
    if shape.pp > 1:
        v = stages_per_rank(model.schedule, model.stages_per_rank)
        if model.n_layer < shape.pp * v or model.n_layer % (shape.pp * v):
            return f"{model.n_layer} blocks do not cut into {shape.pp * v} equal stages"
        chunks = max(chunks * model.pipeline_chunks, shape.pp)
    batch = model.global_batch(shape.dp)
    if batch % (shape.dp * chunks):
        return (f"the batch of {batch} does not split into {shape.dp} data-parallel slices of "
                f"{chunks} micro-batch(es)")
    moe = ({"moe_experts": model.moe_experts, "moe_top_k": model.moe_top_k,
            "moe_capacity_factor": model.moe_capacity_factor,
            "moe_aux_weight": model.moe_aux_weight} if model.moe_experts else {})
    return {"model": {"vocab": model.vocab, "context": model.context, "n_layer": model.n_layer,
                      "n_head": model.n_head, "n_embd": model.n_embd, "tie": model.tie, **moe},
            "mesh": {k: v for k, v in asdict(shape).items()
                     if k not in LATER_DIMS or v != 1},  # the keys of traces kept before
            "world": world, "micro_batch": batch // (shape.dp * chunks),
            "micro_batches": chunks, "precision": model.precision,
            "schedule": model.schedule, "stages_per_rank": model.stages_per_rank,
            **({"foreach": True} if foreach else {})}


def _cp_ep_problem(model: ModelSize, shape: MeshShape) -> str:
    """Why a run would refuse ``shape``'s cp or ep with this model ('' when it would not):
    the rules of ``gputui.plan`` (cp: a context the zig-zag split cuts into 2 x cp chunks, no
    pp, no ZeRO-1; a mixture of experts: data-parallel meshes only, ep dividing the
    data-parallel ranks and the experts, no ZeRO-1 beside ep)."""
    if shape.cp > 1:
        problem = cp_context_problem(model.context, shape.cp)
        if problem:
            return f"context {model.context} does not split into 2 x cp = {2 * shape.cp} chunks"
        if shape.pp > 1:
            return "cp with pp is not in gputui yet"
        if shape.zero == 1 and shape.dp_shard > 1:
            return "ZeRO-1 is not combined with cp (fully_shard over dp_shard x cp is)"
    if model.moe_experts and (shape.tp > 1 or shape.pp > 1 or shape.cp > 1):
        return "the mixture-of-experts GPT takes no tp, pp or cp in gputui"
    if shape.ep > 1:
        if not model.moe_experts:
            return "ep shards a mixture of experts; this GPT is dense"
        if shape.dp % shape.ep or model.moe_experts % shape.ep:
            return (f"ep {shape.ep} must divide both the {shape.dp} data-parallel ranks and "
                    f"the {model.moe_experts} experts")
        if shape.data_parallel == "ddp" and shape.dp_shard > 1:
            return "ZeRO-1 is not combined with ep"
    return ""


def candidates(model: ModelSize, cluster: Cluster, ac: str = "none",
               every_mesh: bool = False) -> list[Candidate]:
    """The meshes of the cluster's world worth planning: every (pp, tp) with tp inside a node,
    and cp with its ring inside a node (cp x tp ranks), and for the data-parallel ranks left:
    all sharded (fsdp, ZeRO-3 and 2; ZeRO-1 without tp, pp or cp), all replicas (ddp) and HSDP
    sharded inside a node; ``every_mesh``: every dp_replicate x dp_shard split. A mixture of
    experts: the data-parallel meshes (the runs take no tp, pp or cp with it), each at every
    ep that divides its data-parallel ranks and the experts. Each at activation
    checkpointing ``ac``. Meshes a run would refuse (cp with pp, a context the zig-zag split
    does not cut) are left out."""
    world = cluster.world
    seen: set[MeshShape] = set()
    out = []
    for m in meshes(world):
        if m.tp * m.cp > cluster.per_node or _cp_ep_problem(model, m):
            continue
        dp = m.dp
        in_node = max(1, cluster.per_node // (m.tp * m.cp
                                              * (m.pp if cluster.nodes == 1 else 1)))
        keep = every_mesh or m.dp_replicate in (1, dp) or (
            m.dp_shard == math.gcd(in_node, dp) and 1 < m.dp_shard < dp)
        if not keep:
            continue
        one = "fsdp" if m.world == 1 else "none"  # a single rank: fsdp over one, as the run
        zeros = [3]
        if m.dp_shard > 1:
            zeros = [3, 2] + ([1] if m.tp == 1 and m.pp == 1 and m.dp_replicate == 1 else [])
        eps = [1]
        if model.moe_experts:
            eps = [e for e in range(1, dp + 1) if dp % e == 0 and model.moe_experts % e == 0]
        for z, ep in ((z, ep) for z in zeros for ep in eps):
            shape = replace(m, zero=z, ac=ac, one_group=one, ep=ep)
            if shape in seen or _cp_ep_problem(model, shape):
                continue
            seen.add(shape)
            spec = spec_of(model, shape, world, cluster.profile.kind == "gpu")
            out.append(Candidate(shape, spec if isinstance(spec, dict) else None,
                                 spec if isinstance(spec, str) else ""))
    return out


# ---------------------------------------------------------------- time
def _span(shape: MeshShape, c: dict[str, Any]) -> int:
    """How many consecutive ranks a collective's group spans (the mesh is row-major over
    pp, dp_replicate, dp_shard, tp: tp innermost)."""
    if c["kind"] == "send":
        return 2 * shape.dp * shape.tp
    if c["kind"] == RING:  # the cp ranks of a ring lie tp apart
        return shape.cp * shape.tp
    if shape.ep > 1 and c["kind"] == "all-reduce" and c["group"] == shape.dp // shape.ep:
        return shape.dp  # ep's expert replicas: stride ep
    if shape.tp > 1 and c["group"] == shape.tp and c["kind"] == "all-reduce" and \
            c["phase"] != "optimizer" and not c.get("formula"):
        return shape.tp
    if c["group"] == shape.dp_replicate and shape.dp_shard > 1 and c["kind"] == "all-reduce":
        return shape.tp * shape.dp  # HSDP's replicas: stride tp x dp_shard
    return shape.tp * max(1, c["group"])


def collective_time(c: dict[str, Any], shape: MeshShape, cluster: Cluster) -> float:
    """Seconds of one step's calls of collective ``c`` (ring model, see the module doc)."""
    p = cluster.profile
    n = max(1, int(c["group"]))
    inside = _span(shape, c) <= cluster.per_node
    bw = (p.link_gbs if inside else p.net_gbs) * 1e9
    if p.kind == "gpu":
        bw *= 0.8  # DEFAULT_LINK_EFFICIENCY: busbw against the data sheet
    lat = (p.link_latency_us if inside else p.net_latency_us) * 1e-6
    if n == 1 and c["kind"] not in ("send", RING):
        return 0.0
    factor, steps = {"all-reduce": (2 * (n - 1) / n, 2 * (n - 1)),
                     "all-gather": ((n - 1) / n, n - 1), "all-to-all": ((n - 1) / n, n - 1),
                     "reduce-scatter": ((n - 1) / n, n - 1),
                     "broadcast": (1.0, 1), "send": (1.0, 1)}.get(c["kind"], (1.0, 1))
    return c["count"] * steps * lat + c["bytes"] * factor / bw if bw > 0 else math.inf


def core_share(p: Profile, ranks_per_node: int) -> float:
    """The share of its threads' cores a rank has: CPU ranks of one machine share its cores
    (more ranks than cores take turns); 1 on a GPU."""
    if p.kind != "cpu" or not p.cores:
        return 1.0
    threads = max(1, p.cores // ranks_per_node)
    return min(1.0, p.cores / (ranks_per_node * threads))


def rank_rate(p: Profile, dtype: str, ranks_per_node: int) -> float:
    """FLOP/s a rank reaches: the profile's peak x efficiency; CPU ranks share the cores."""
    return p.peak_flops(dtype) * p.efficiency * core_share(p, ranks_per_node)


def host_time(work: dict[str, dict[str, int]], p: Profile, ranks_per_node: int) -> float:
    """Seconds a rank's host spends on a step beside its FLOPs (``work``: the traced counts
    by phase): dispatching its operations, plain and DTensor, and writing the bytes of those
    without a FLOP formula (elementwise work): the profile's cost of each (the CPU's
    measured; 0 where none is priced), on the rank's share of the cores."""
    ops = sum(int(w.get("ops", 0)) for w in work.values())
    dtensor = sum(int(w.get("dtensor_ops", 0)) for w in work.values())
    written = sum(int(w.get("bytes", 0)) for w in work.values())
    return (ops * p.op_s + dtensor * p.dtensor_op_s + written * p.byte_s) \
        / core_share(p, ranks_per_node)


@dataclass
class Row:
    """One mesh's plan."""

    shape: MeshShape
    strategy: str
    mem: dict[str, int] = field(default_factory=dict)
    at_peak: dict[str, int] = field(default_factory=dict)  # the parts at the peak's moment
    peak: int = 0
    fits: bool = False
    step_s: float | None = None
    compute_s: float = 0.0  # the FLOPs' time and the host's (host_s), the bubble included
    host_s: float = 0.0  # the step's dispatch and written bytes (CPU: measured per op, byte)
    comm_exposed_s: float = 0.0
    tokens_per_s: float | None = None
    mfu: float | None = None
    flops: int = 0
    comm: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    skipped: bool = False  # not a mesh of this model and batch (reason says why): not traced
    formula: list[str] = field(default_factory=list)
    per_block_act: int = 0
    batch: int = 0
    micro_batch: int = 0

    def to_dict(self) -> dict[str, Any]:
        s = self.shape
        return {"mesh": s.describe(), "strategy": self.strategy,
                "degrees": {"pp": s.pp, "dp_replicate": s.dp_replicate,
                            "dp_shard": s.dp_shard, "tp": s.tp, "cp": s.cp, "ep": s.ep},
                # ZeRO is a stage of sharded data parallelism: none without dp_shard (the
                # table's "-")
                "zero": s.zero if s.dp_shard > 1 else None, "ac": s.ac, "mem": self.mem,
                "peak": self.peak,
                "fits": self.fits, "step_s": self.step_s, "compute_s": self.compute_s,
                "host_s": self.host_s,
                "comm_exposed_s": self.comm_exposed_s, "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "flops_per_rank": self.flops, "collectives": self.comm,
                "reason": self.reason, "formula": self.formula,
                "activations_per_block": self.per_block_act, "batch": self.batch,
                "micro_batch": self.micro_batch}


def make_row(c: Candidate, got: dict[str, Any] | None, model: ModelSize,
             cluster: Cluster) -> Row:
    """A candidate's row from its traced figures (or its reason)."""
    shape = c.shape
    row = Row(shape, strategy_name(shape))
    if c.spec is None or got is None or "error" in (got or {}):
        row.reason = c.skip or (got or {}).get("error", "not traced")
        row.skipped = c.spec is None
        return row
    p = cluster.profile
    row.batch = model.global_batch(shape.dp)
    row.micro_batch = c.spec["micro_batch"]
    row.mem = {k: int(got["mem"].get(k, 0)) for k in MEM_PARTS}
    row.formula = list(got.get("formula", []))
    added = 0
    if row.mem["optim"] == 0 and row.mem["params"]:
        # seen with pp over replicas: the tracker files no optimizer state at the peak's
        # moment; AdamW keeps two fp32 moments of each (sharded) parameter all step
        row.mem["optim"] = added = 2 * row.mem["params"]
        row.formula.append("optimizer state: the tracker reported none at the peak; AdamW's "
                           "2 moments of the rank's parameters added")
    row.at_peak = dict(row.mem)
    # the gradients' own size (the parameters', sharded alike) where the peak came before
    # backward made them: the column says what the rank holds, the peak when
    row.mem["grads"] = max(row.mem["grads"], row.mem["params"])
    # extrapolated parts can come from other moments at the two traced depths (a peak in backward
    # at one depth, in the optimizer at the other): the peak is never below what it holds
    # besides activations (the activations column is their size as backward begins, not
    # at the peak's moment)
    floor = sum(v for k, v in row.at_peak.items() if k != "activations")
    row.peak = max(int(got["mem"]["peak"]) + added, floor)
    row.per_block_act = int(got.get("per_block", {}).get("activations", 0))
    row.flops = int(got["flops"])
    row.fits = row.peak <= p.usable()
    if shape.cp > 1 and p.kind == "gpu":
        row.formula.append("cp on GPUs: the ring traced is gputui's (the CPU's); a CUDA run "
                           "takes PyTorch's context_parallel on flash attention where its torch "
                           "has it, which keeps no block of scores: the temporaries of cp rows "
                           "are an upper bound there")
    ranks = min(cluster.per_node, cluster.world)
    rate = rank_rate(p, model.dtype(), ranks)
    row.host_s = host_time(got.get("work", {}), p, ranks)
    compute = (row.flops / rate if rate > 0 else math.inf) + row.host_s
    if shape.pp > 1:
        chunks = c.spec["micro_batches"]
        v = stages_per_rank(model.schedule, model.stages_per_rank)
        if model.schedule in ZERO_BUBBLE:
            bubble = 1.0
        elif PP_PLACEMENT[model.schedule] == 1:
            bubble = (chunks + shape.pp - 1) / chunks
        else:
            bubble = (chunks + (shape.pp - 1) / v) / chunks
        # a stage idle in the bubble waits for another's work; CPU ranks on shared cores
        # (fewer cores than ranks) give theirs to the ranks that have work meanwhile: the
        # step is then the machine's work over its cores where that takes longer
        share = core_share(p, ranks)
        compute = max(compute * share * bubble, compute)
    inline, overlapped, units = 0.0, 0.0, 1
    for coll in got["comm"]:
        t = collective_time(coll, shape, cluster)
        row.comm.append(dict(coll, seconds=t))
        # pp's sends, cp's ring hops and ep's all-to-alls wait in line with the compute (the
        # ring overlaps each hop with one block's attention only: counted exposed)
        if coll["kind"] in ("send", RING, "all-to-all") or _span(shape, coll) == shape.tp > 1:
            inline += t
        else:
            overlapped += t
            units = max(units, int(coll["count"]))
    if p.kind == "cpu":
        exposed = overlapped
    else:
        exposed = max(overlapped - compute, overlapped / units)
    row.compute_s = compute
    row.comm_exposed_s = inline + exposed
    row.step_s = compute + inline + exposed
    tokens = row.batch * model.context
    row.tokens_per_s = tokens / row.step_s if row.step_s else None
    peak = p.peak_flops(model.dtype())
    row.mfu = row.flops / (row.step_s * peak) if row.step_s and peak else None
    if not row.fits:
        row.reason = why_not_fit(row, model, p)
    return row


def ac_may_fit(row: Row, p: Profile) -> bool:
    """Whether activation checkpointing could make ``row``'s mesh fit: its activations are a
    good part of the peak (a quarter or more), and what checkpointing leaves as it is (the
    rank's parameters, gradients and optimizer state) fits the usable memory on its own
    (where it does not, no checkpointing mode fits and the mesh is not traced again)."""
    if row.fits or not row.peak or row.mem.get("activations", 0) <= 0.25 * row.peak:
        return False
    state = sum(row.mem.get(k, 0) for k in ("params", "grads", "optim"))
    return state <= p.usable()


def why_not_fit(row: Row, model: ModelSize, p: Profile) -> str:
    """The largest part of the peak in words, and the lever that shrinks it."""
    m = row.at_peak or row.mem
    state = m["params"] + m["grads"] + m["optim"] + m["gathered"]
    parts = {"activations": m["activations"], "state": state,
             "temps": m["temps"] + m["buffers"]}
    top = max(parts, key=lambda k: parts[k])
    head = f"peak {row.peak / GIB:.1f} GiB per rank > {p.usable() / GIB:.1f} GiB usable"
    shape = row.shape
    # cp: each rank holds 1/cp of every sequence, so its activations and logits fall where
    # its sequences cannot shrink otherwise: one sequence a rank, or a batch per
    # data-parallel rank (with a global batch and several sequences a rank, dp ranks turned
    # cp ranks hold the same tokens)
    more_cp = shape.cp * 2
    cp = (f"cp = {more_cp} (each rank holds 1/{more_cp} of every sequence)"
          if shape.pp == 1 and (model.local_batch or row.micro_batch <= 1)
          and not _cp_ep_problem(model, replace(shape, cp=more_cp)) else "")
    micro = "more micro-batches" if row.micro_batch > 1 else ""
    if top == "activations":
        tries = [x for x in (cp, "ac = full" if shape.ac != "full" else "",
                             "ac = selective" if shape.ac == "none" else "",
                             "more tp" if shape.tp < 8 else "", micro) if x] \
            or ["more pp", "devices with more memory"]  # every lever of this mesh pulled
        return (f"activations of {m['activations'] / GIB:.1f} GiB per rank at context "
                f"{model.context}: try {' or '.join(tries)} ({head})")
    if top == "state":
        lever = "fsdp (zero 3)" if shape.dp_shard == 1 or shape.zero < 3 else "more tp or pp"
        return (f"parameters, gradients and optimizer state of {state / GIB:.1f} GiB per rank: "
                f"try {lever} ({head})")
    ring = ", the ring's block scores" if shape.cp > 1 else ""
    tries = [x for x in (cp, micro) if x]
    return (f"temporaries of {parts['temps'] / GIB:.1f} GiB (logits over a vocabulary of "
            f"{model.vocab}{ring} and the collectives' buffers)"
            + (f": try {' or '.join(tries)}" if tries else "") + f" ({head})")


def order(rows: list[Row]) -> list[Row]:
    """Those that fit, most tokens/s first (the batch can differ between meshes: with a
    batch per data-parallel rank, the step time does not compare); then those that do not,
    smallest peak first; then the meshes with no figures."""
    fit = sorted((r for r in rows if r.fits and r.step_s), key=lambda r: -(r.tokens_per_s or 0))
    over = sorted((r for r in rows if not r.fits and r.peak), key=lambda r: r.peak)
    rest = [r for r in rows if not r.peak]
    return fit + over + rest


def pareto(rows: list[Row]) -> list[Row]:
    """The rows that fit and that no other beats on both peak memory and speed."""
    fit = [r for r in rows if r.fits and r.tokens_per_s]
    out = []
    for r in fit:
        beaten = any(o is not r and o.peak <= r.peak and (o.tokens_per_s or 0) >=
                     (r.tokens_per_s or 0) and (o.peak < r.peak or (o.tokens_per_s or 0) >
                                                (r.tokens_per_s or 0)) for o in fit)
        if not beaten:
            out.append(r)
    return sorted(out, key=lambda r: r.peak)
