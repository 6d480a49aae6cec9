"""The device mesh of a multi-process run, before torch: its degrees, their names and order.

torchtitan's model: the ranks form an N-D mesh whose dimensions are the parallelisms (pipeline,
data-parallel replicate, data-parallel shard, context, tensor), the product of the degrees is
the world size, and each parallelism is applied by a function over the model and its dimension
of the mesh (``gputui.train.parallelize``). Every named multi-process strategy is a point of
that mesh (:func:`mesh_of`); ``strategy.name = 'mesh'`` takes the degrees from ``[parallel]``.
Whether a mesh can run with a config on some devices is ``gputui.plan``'s to say: this module
only derives it (torch-free: the CLI, the app and the plan read it without importing torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gputui.core.config_schema import PP_PLACEMENT  # the schedules, as the config names them

if TYPE_CHECKING:
    from gputui.core.config import RunConfig

# the dimensions, outermost first (torchtitan's order: pp, dp_replicate, dp_shard, cp, tp):
# ranks next to each other (on one machine, on NVLink) share a tensor-parallel group, then a
# context-parallel ring
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
MESH_STRATEGIES = ("ddp", "fsdp", "tp", "fsdp_tp", "pp", "cp", "mesh")  # every point of the mesh
ZERO_BUBBLE = ("interleaved_zb", "zbv", "dualpipev")  # weight gradients fill the bubble


def stages_per_rank(schedule: str, asked: int) -> int:
    """How many stages each rank holds under ``schedule`` (``asked``: stages_per_rank)."""
    kind = PP_PLACEMENT[schedule]
    return 1 if kind == 1 else 2 if kind == "V" else asked


@dataclass(frozen=True)
class MeshShape:
    """The degrees of one run's mesh and its memory levers (``[parallel]``'s zero and ac)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1  # context parallelism: each sequence split over cp ranks (ring attention)
    zero: int = 3  # ZeRO stage of the dp_shard dimension (1, 2, 3)
    ac: str = "none"  # activation checkpointing: none, full, selective
    # how one data-parallel group keeps the model: ddp and fsdp wrap even a single rank, so
    # their one-device run is the same program as their N-device one
    one_group: str = "none"
    # expert parallelism: groups of ep consecutive data-parallel ranks share out the experts
    # of a mixture of experts (carved from the dp ranks: not a factor of the world)
    ep: int = 1

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel groups: each takes its own slice of every batch."""
        return self.dp_replicate * self.dp_shard

    def degree(self, dim: str) -> int:
        return int(getattr(self, dim))

    def dims(self) -> list[tuple[str, int]]:
        """The dimensions with a degree above 1, outermost first (one dimension of size 1
        when every degree is 1: a mesh of one rank)."""
        out = [(d, self.degree(d)) for d in DIMS if self.degree(d) > 1]
        return out or [("dp_shard", 1)]

    @property
    def data_parallel(self) -> str:
        """How the data-parallel ranks keep the model: 'none' (one group), 'ddp' (replicas
        all-reducing gradients: DistributedDataParallel, with ZeRO-1's sharded optimizer state
        where zero = 1 and the mesh shards), or 'fsdp' (fully_shard over the dp dimensions:
        ZeRO-2 or 3, HSDP with replicas, and every data-parallel dimension beside tp or pp).
        The context-parallel ranks of a data-parallel group average their gradients too
        (each trained on its part of every sequence): torchtitan folds cp into the dp_shard
        dimension, so cp alone is 'ddp' over the cp ranks."""
        if self.dp == 1 and self.cp == 1:
            return self.one_group
        # DDP takes neither DTensors (tp) nor a pipeline's several forwards before backward
        if self.tp == 1 and self.pp == 1 and (self.dp_shard == 1 or self.zero == 1):
            return "ddp"
        return "fsdp"

    def describe(self) -> str:
        """'dp_shard 2 x tp 2', 'dp_replicate 4', '1 rank'."""
        dims = [f"{d} {n}" for d, n in self.dims() if n > 1]
        ep = f" (ep {self.ep})" if self.ep > 1 else ""
        return (" x ".join(dims) if dims else "1 rank") + ep

    def levers(self) -> str:
        """The memory levers that apply, in words ('' when none does)."""
        out = []
        if self.dp_shard > 1:
            out.append(f"ZeRO-{self.zero}")
        if self.ac != "none":
            out.append(f"{self.ac} activation checkpointing")
        return ", ".join(out)


def coordinates(shape: MeshShape, rank: int) -> dict[str, int]:
    """Rank ``rank``'s place along each dimension of ``shape`` above 1 (the mesh is laid
    out row-major over DIMS, as torch's init_device_mesh lays it)."""
    out: dict[str, int] = {}
    rest = rank
    for dim in reversed(DIMS):
        n = shape.degree(dim)
        out[dim] = rest % n
        rest //= n
    return {d: out[d] for d in DIMS if shape.degree(d) > 1}


def rank_label(shape: MeshShape, rank: int) -> str:
    """What rank ``rank`` holds, in words: 'stage 1 · dp 0 (replica 0, shard 0) · tp 1'."""
    c = coordinates(shape, rank)
    parts = []
    if "pp" in c:
        parts.append(f"stage {c['pp']}")
    if shape.dp > 1:
        dp = c.get("dp_replicate", 0) * shape.dp_shard + c.get("dp_shard", 0)
        sub = []
        if "dp_replicate" in c and "dp_shard" in c:
            sub = [f"replica {c['dp_replicate']}", f"shard {c['dp_shard']}"]
        parts.append(f"dp {dp}" + (f" ({', '.join(sub)})" if sub else ""))
        if shape.ep > 1:  # its place in its expert-parallel group: which experts it holds
            parts.append(f"ep {dp % shape.ep}")
    if "cp" in c:
        parts.append(f"cp {c['cp']}")
    if "tp" in c:
        parts.append(f"tp {c['tp']}")
    return " · ".join(parts)


def tp_heads_problem(heads: int, tp: int) -> str | None:
    """Tensor parallelism's rule, written once (the plan checks the config's model.n_head, the
    tp function the built model's heads): every rank holds n_head / tp whole heads."""
    if heads % tp:
        return (f"model.n_head = {heads} does not split over {tp} tensor-parallel ranks; use a "
                f"head count divisible by {tp}")
    return None


def cp_context_problem(context: int, cp: int) -> str | None:
    """Context parallelism's rule, written once: the zig-zag split cuts each sequence into
    2 x cp equal chunks (rank i holds chunks i and 2 cp - 1 - i, so every rank does the same
    share of the causal triangle)."""
    if cp > 1 and context % (2 * cp):
        return (f"data.context = {context} does not split into 2 x parallel.cp = {2 * cp} equal "
                f"chunks (the zig-zag split of context parallelism); use a context divisible "
                f"by {2 * cp}")
    return None


def tp_group(asked: int, world: int) -> int:
    """fsdp_tp's ranks per tensor-parallel group: ``strategy.tp_size``, or 0 for 2 (1 with
    one rank)."""
    return asked or min(2, world)


def mesh_of(cfg: RunConfig, world: int) -> MeshShape:
    """The mesh of ``cfg``'s strategy over ``world`` ranks: the named strategy's point, or
    ``[parallel]``'s degrees for 'mesh' (dp_shard = -1: the ranks the others leave, at least
    1). Degrees that do not multiply to the world are ``gputui.plan``'s rule to report; here
    they are returned as they are."""
    par, name = cfg.parallel, cfg.strategy.name
    z, ac, ep = par.zero, par.ac, par.ep
    if name == "ddp":
        return MeshShape(dp_replicate=world, zero=z, ac=ac, one_group="ddp", ep=ep)
    if name == "fsdp":
        return MeshShape(dp_shard=world, zero=z, ac=ac, one_group="fsdp", ep=ep)
    if name == "tp":
        return MeshShape(tp=world, zero=z, ac=ac)
    if name == "pp":
        return MeshShape(pp=world, zero=z, ac=ac)
    if name == "cp":  # the cp ranks average gradients (DDP over them), even on one rank
        return MeshShape(cp=world, zero=z, ac=ac, one_group="ddp")
    if name == "fsdp_tp":
        tp = tp_group(cfg.strategy.tp_size, world)
        return MeshShape(dp_shard=max(1, world // tp), tp=tp, zero=z, ac=ac)
    cp = par.cp
    rest = par.pp * par.dp_replicate * cp * par.tp
    shard = par.dp_shard if par.dp_shard != -1 else max(1, world // rest)
    return MeshShape(pp=par.pp, dp_replicate=par.dp_replicate, dp_shard=shard, tp=par.tp,
                     cp=cp, zero=z, ac=ac, ep=ep)


def meshes(world: int) -> list[MeshShape]:
    """Every mesh of ``world`` ranks (each degree a divisor, the product the world), the
    plain data-parallel ones first: what the app and ``gputui strategies`` offer."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    out = [MeshShape(pp=p, dp_replicate=r, dp_shard=s, tp=t, cp=c)
           for p in divisors for r in divisors for s in divisors for t in divisors
           for c in divisors if p * r * s * t * c == world]
    return sorted(out, key=lambda m: (m.pp, m.tp, m.cp, m.dp_replicate))
