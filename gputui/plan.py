"""The cross-field rules of a run's config, in one place.

:func:`validate` checks a config against devices already resolved (once per run by
``gputui.hw.discovery``, or from the app's last discovery): pure, it asks neither the hardware
nor the disk, so the app runs it on every keystroke. :func:`why_not` is the part of it that
depends on the strategy chosen: what the app's strategy picker and ``gputui strategies`` show
for a strategy that cannot run. :func:`check_files` checks what the config names on disk (the
factories' files, the checkpoint to resume from): once, when a run or a sweep starts. A field's
own rules are beside the field (``gputui.core.config_schema``); validate and check_files raise
:class:`ConfigError` with one line on the first broken rule.

``origins`` maps each overridden "table.key" to where its value came from ("--devices",
"--set optim.lr=0.2", see ``config.override_origins``): a broken rule is blamed on the flags
that set its keys, and on ``source`` (the preset) only when none of them was overridden.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from gputui.core import ckptfile, registry
from gputui.core.config import ConfigError, RunConfig, effective_batch_size
from gputui.core.config_schema import TEXT_DATASETS
from gputui.core.datafiles import SYNTHETIC_SIZES
from gputui.core.devices import Device, DeviceSpecError, backend_for
from gputui.core.mesh import (MESH_STRATEGIES, PP_PLACEMENT, MeshShape, cp_context_problem,
                              mesh_of, meshes, stages_per_rank, tp_group, tp_heads_problem)
from gputui.core.mp_plan import check_split_points, model_layers
from gputui.core.registry import StrategyInfo
from gputui.core.runstore import CHECKPOINT_NAME
from gputui.core.usercode import CODE_KEYS, find_problem

# a broken rule: the keys it is blamed on, and its one line
Problem = tuple[tuple[str, ...], str]
# the keys of a rule about the strategy chosen: what why_not reports
CHOICE = ("strategy.name", "devices.spec")


def validate(cfg: RunConfig, devices: list[Device], source: str,
             origins: dict[str, str] | None = None) -> None:
    """Every rule that joins several keys, or a key and the ``devices`` the config resolved
    to; raises ConfigError on the first broken one."""
    for keys, text in _problems(cfg, devices):
        raise ConfigError(f"{blame(source, origins, *keys, text=text)}: {text}")


def why_not(cfg: RunConfig, devices: list[Device]) -> str | None:
    """None when ``cfg``'s strategy can run with this config on these devices, else the
    reason (one line): the first rule broken by the choice of strategy and devices."""
    for keys, text in _problems(cfg, devices):
        if "strategy.name" in keys:
            return text
    return None


def mesh_choices(cfg: RunConfig, devices: list[Device]) -> list[tuple[MeshShape, str | None]]:
    """Every mesh of the ranks ``devices`` give (``dist.nnodes`` machines of them), each with
    why ``cfg`` cannot run on it (None: it can): what ``gputui strategies`` and the app show
    for strategy 'mesh'."""
    ranks = len(devices) * cfg.dist.nnodes
    out = []
    for shape in meshes(ranks):
        # a mixture of experts: each expert-parallel degree its data-parallel ranks allow too
        eps = [1] + ([e for e in range(2, shape.dp + 1) if shape.dp % e == 0
                      and cfg.model.moe_experts % e == 0] if cfg.model.moe_experts else [])
        for ep in eps:
            trial = cfg.replace(strategy={"name": "mesh"}, parallel={
                "dp_replicate": shape.dp_replicate, "dp_shard": shape.dp_shard, "tp": shape.tp,
                "pp": shape.pp, "cp": shape.cp, "ep": ep})
            out.append((mesh_of(trial, ranks), why_not(trial, devices)))
    return out


def caveat(cfg: RunConfig, devices: list[Device]) -> str | None:
    """What a strategy that can run really does on these devices, where that is not what its
    name promises (one line), else None: what ``gputui strategies`` and the app's strategy
    list show beside "can run"."""
    if cfg.strategy.name == "dp" and devices and all(d.kind == "cpu" for d in devices):
        idle = [d.name for d in devices[1:]]
        return ("runs unreplicated: DataParallel has no CPU mode, so the whole batch trains on "
                f"{devices[0].name}" + (f" ({', '.join(idle)} idle)" if idle else ""))
    return None


def _problems(cfg: RunConfig, devices: list[Device]) -> Iterator[Problem]:
    """Every rule ``cfg`` breaks on ``devices``, in the order they are reported."""
    # the [dist] table's own rules first: they hold whatever the strategy
    if cfg.dist.node_rank >= cfg.dist.nnodes:
        yield (("dist.node_rank", "dist.nnodes"),
               f"dist.node_rank ({cfg.dist.node_rank}) must be below dist.nnodes "
               f"({cfg.dist.nnodes})")
    if cfg.dist.nnodes > 1 and not cfg.dist.rdzv_endpoint:
        yield (("dist.nnodes", "dist.rdzv_endpoint"),
               "dist.nnodes > 1 needs dist.rdzv_endpoint = 'HOST:PORT' (--rdzv-endpoint)")
    slow = cfg.debug.slow_rank  # a straggler on purpose: a rank of a multi-process strategy
    if slow >= 0 and cfg.strategy.name not in ("ddp", "fsdp", "tp", "fsdp_tp", "cp", "mesh"):
        yield (("debug.slow_rank", "strategy.name"),
               f"debug.slow_rank slows a rank of ddp, fsdp, tp, fsdp_tp, cp or mesh, not "
               f"{cfg.strategy.name} (-1 = none)")
    elif slow >= 0 and devices and slow >= len(devices) * cfg.dist.nnodes:
        yield (("debug.slow_rank",), f"debug.slow_rank ({slow}) is not a rank of this run: it "
                                     f"has {len(devices) * cfg.dist.nnodes} (0 to "
                                     f"{len(devices) * cfg.dist.nnodes - 1}; -1 = none)")
    info = registry.get(cfg.strategy.name)
    if info is None:
        yield (("strategy.name",), f"strategy.name must be one of "
                                   f"{', '.join(registry.names())}; got {cfg.strategy.name!r}")
        return
    yield from _strategy_problems(cfg, devices, info)
    yield from _moe_problems(cfg, devices, info.name)
    n = len(devices)
    weights = cfg.strategy.split_weights
    if weights and len(weights) != n:
        yield (("strategy.split_weights", "devices.spec"),
               f"strategy.split_weights has {len(weights)} entries for {n} devices; give one "
               f"weight per device")
    if cfg.run.precision == "fp16" and all(d.kind == "cpu" for d in devices):
        yield (("run.precision", "devices.spec"),
               "run.precision = 'fp16' needs CUDA devices; use 'bf16' on CPU")
    steps = planned_steps(cfg, effective_batch_size(cfg, n))
    if steps is not None and cfg.optim.warmup_steps >= steps:
        yield (("optim.warmup_steps", "run.epochs", "optim.batch_size", "data.train_size"),
               f"optim.warmup_steps ({cfg.optim.warmup_steps}) is not shorter than the run "
               f"({steps} optimizer steps); lower it or train longer")

    ac = _ac_problem(cfg)
    if ac:
        yield ac
    yield from _task_problems(cfg)


def _task_problems(cfg: RunConfig) -> Iterator[Problem]:
    """The model and the data agree on the task: gpt reads text, the image models images;
    gpt's heads divide its width; the text dataset has its path."""
    m, d = cfg.model, cfg.data
    text = d.name in TEXT_DATASETS and not d.factory
    if not m.factory and m.name == "gpt" and not text and not d.factory:
        yield (("model.name", "data.name"), f"model.name = 'gpt' reads text; set data.name to "
                                            f"pystdlib or text (got {d.name!r})")
    if text and not m.factory and m.name != "gpt":
        yield (("model.name", "data.name"), f"data.name = {d.name!r} is text (byte tokens); "
                                            f"use model.name = 'gpt' or a model.factory that "
                                            f"reads tokens (got model.name = {m.name!r})")
    if not m.factory and m.name == "gpt" and m.n_embd % m.n_head:
        yield (("model.n_embd", "model.n_head"), f"model.n_head ({m.n_head}) must divide "
                                                 f"model.n_embd ({m.n_embd})")
    if text and d.name == "text" and not d.path:
        yield (("data.name", "data.path"), "data.name = 'text' needs data.path: a text file "
                                           "or a folder of them")


def warmup_problem(cfg: RunConfig, devices: list[Device], n_train: int) -> str | None:
    """The warm-up rule of :func:`validate` for data whose training set size only the disk
    tells (``n_train`` examples, e.g. the windows of a text file): None, or the line."""
    batch = effective_batch_size(cfg, len(devices))
    steps = cfg.run.epochs * (n_train // batch) if 0 < batch <= n_train else None
    if steps is not None and cfg.optim.warmup_steps >= steps:
        return (f"optim.warmup_steps ({cfg.optim.warmup_steps}) is not shorter than the run "
                f"({steps} optimizer steps); lower it or train longer")
    return None


def planned_steps(cfg: RunConfig, batch: int) -> int | None:
    """The run's optimizer steps where the config alone fixes them (the embedded synthetic
    set: its size is data.train_size); None for data read from disk or built by code, whose
    size the run checks once it is loaded (``gputui.train.optim.Updater.plan``).

    The embedded ``pystdlib`` text capped by ``data.train_size`` has that many windows (its
    text holds far more), so a warm-up the cap already outlasts is refused here, before any
    process starts, not by the ranks after their start-up."""
    if cfg.data.factory:
        return None
    if cfg.data.name == "pystdlib" and cfg.data.train_size:
        n_train = cfg.data.train_size
    elif cfg.data.name == "synthetic":
        n_train = cfg.data.train_size or SYNTHETIC_SIZES["train"]
    else:
        return None
    return cfg.run.epochs * (n_train // batch) if batch <= n_train else None


def _strategy_problems(cfg: RunConfig, devices: list[Device],
                       info: StrategyInfo) -> Iterator[Problem]:
    """The rules of ``info``'s strategy on these devices."""
    n, name, spec = len(devices), info.name, cfg.devices.spec
    if n < info.min_devices:
        yield CHOICE, (f"strategy '{name}' needs at least {info.min_devices} devices, "
                       f"devices.spec '{spec}' gives {n}; e.g. --devices cpu*2")
    if info.max_devices is not None and n > info.max_devices:
        yield CHOICE, (f"strategy '{name}' uses {info.max_devices} device, devices.spec "
                       f"'{spec}' gives {n}; use --devices cpu or another strategy")
    if cfg.dist.nnodes > 1 and not info.multiprocess:
        yield CHOICE, (f"dist.nnodes = {cfg.dist.nnodes} needs a multi-process strategy (ddp "
                       f"or fsdp), not '{name}'")
    if info.multiprocess:
        kinds = {d.kind for d in devices}
        if len(kinds) > 1:
            yield CHOICE, f"strategy '{name}' needs devices of one kind (all CUDA or all CPU)"
        nccl = backend_problem(cfg.strategy.backend, devices, "strategy.backend = 'nccl'",
                               f"devices.spec '{spec}'")
        if nccl:
            yield CHOICE, nccl
    degrees = _degrees_problem(cfg, name)
    if degrees:
        yield degrees
    elif name in MESH_STRATEGIES:
        yield from _mesh_problems(cfg, devices, name)
    elif cfg.parallel.zero != 3:
        yield CHOICE + ("parallel.zero",), (
            f"parallel.zero shards the data-parallel ranks of fsdp or a mesh, not '{name}'; "
            f"leave it at 3")
    elif cfg.parallel.ac != "none" and name != "single":
        yield CHOICE + ("parallel.ac",), (
            f"parallel.ac applies to single and the mesh strategies ({', '.join(MESH_STRATEGIES)}"
            f"), not '{name}'; set parallel.ac = 'none'")
    if name == "model_parallel":
        yield from _stage_problems(cfg, devices)
    elif cfg.strategy.split_weights and not info.weighted and name != "mesh":
        yield CHOICE, f"strategy.split_weights applies to scratch and ddp, not '{name}'; remove it"
    batch = _batch_problem(cfg, devices, info)
    if batch:
        yield batch
    per_micro = effective_batch_size(cfg, n) // cfg.optim.micro_batches
    chunks = cfg.strategy.pipeline_chunks
    if name == "model_parallel" and chunks > 1 and chunks > per_micro:
        yield CHOICE, (f"strategy.pipeline_chunks ({chunks}) is more than the {per_micro} "
                       f"examples of each micro-batch; lower pipeline_chunks or raise "
                       f"optim.batch_size")


def _stage_problems(cfg: RunConfig, devices: list[Device]) -> Iterator[Problem]:
    """model_parallel: enough layers for the stages, no split_weights, valid split points, no
    weight tied across devices."""
    n, model = len(devices), cfg.model.factory or cfg.model.name
    # a model.factory's blocks are known once it is built: the training process checks them
    layers = model_layers(cfg)
    if model == "gpt" and cfg.model.tie and len({d.torch_device for d in devices}) > 1:
        yield CHOICE + ("model.tie",), (
            "strategy 'model_parallel' puts gpt's embedding and head on different devices, "
            "which cannot share one weight; set model.tie = false")
    if layers is not None and n > layers:
        yield CHOICE, (f"strategy 'model_parallel' cuts {model} into at most {layers} stages "
                       f"(one per layer), devices.spec '{cfg.devices.spec}' gives {n}; use "
                       f"fewer devices")
    if cfg.strategy.split_weights:
        yield CHOICE, ("strategy.split_weights applies to scratch and ddp, not "
                       "'model_parallel'; remove it")
    reason = check_split_points(list(cfg.strategy.split_points),
                                layers if layers is not None else 2**62, n, model)
    if reason:
        yield CHOICE, reason


# [parallel]'s mesh degrees at their defaults: what a named strategy leaves them at
_DEGREE_DEFAULTS = {"dp_replicate": 1, "dp_shard": -1, "tp": 1, "pp": 1, "cp": 1}


def _degrees_problem(cfg: RunConfig, name: str) -> Problem | None:
    """[parallel]'s degrees belong to strategy 'mesh': every other strategy, a named point of
    the mesh or not, leaves them at their defaults (one rule, one sentence)."""
    if name == "mesh":
        return None
    for key, default in _DEGREE_DEFAULTS.items():
        if getattr(cfg.parallel, key) != default:
            point = " is its own point of the mesh;" if name in MESH_STRATEGIES else ":"
            return CHOICE + (f"parallel.{key}",), (
                f"parallel.{key} sets a degree of strategy 'mesh', and '{name}'{point} set "
                f"strategy.name = 'mesh' or remove parallel.{key}")
    return None


def _mesh_problems(cfg: RunConfig, devices: list[Device], name: str) -> Iterator[Problem]:
    """The mesh strategies: the degrees multiply to the ranks (every rule of the mesh, once);
    tp on the built-in GPT whose heads divide over it; the ZeRO stage and the activation
    checkpointing where they apply."""
    ranks = len(devices) * cfg.dist.nnodes
    par = cfg.parallel
    if name == "fsdp_tp":
        tp = tp_group(cfg.strategy.tp_size, ranks)
        if ranks % tp or ranks == tp:
            yield CHOICE, (f"strategy 'fsdp_tp' needs the {ranks} ranks to be several groups "
                           f"of strategy.tp_size = {tp}; e.g. --devices cpu*4 with tp_size 2")
            return
    shape = mesh_of(cfg, ranks)
    if name == "mesh":
        fixed = par.pp * par.dp_replicate * par.tp
        fixed *= par.cp
        cp = f" x cp {par.cp}" if par.cp > 1 else ""
        degrees = (f"pp {par.pp} x dp_replicate {par.dp_replicate} x dp_shard "
                   f"{par.dp_shard}{cp} x tp {par.tp}")
        if par.dp_shard == -1 and ranks % fixed:
            named = "pp x dp_replicate x cp x tp" if par.cp > 1 else "pp x dp_replicate x tp"
            yield CHOICE + ("parallel.pp", "parallel.dp_replicate", "parallel.cp",
                            "parallel.tp"), (
                f"the mesh's {named} = {fixed} does not divide the {ranks} ranks devices.spec "
                f"gives; choose degrees whose product divides {ranks}")
            return
        if shape.world != ranks:
            yield CHOICE + ("parallel.dp_shard",), (
                f"the mesh's degrees ({degrees}) multiply to {shape.world}, not the {ranks} "
                f"ranks devices.spec gives; change a degree (parallel.dp_shard = -1 takes the "
                f"ranks the others leave)")
            return
    if shape.cp > 1 or name == "cp":
        problem = _cp_problem(cfg, shape, name)
        if problem:
            yield problem
            return
    if shape.tp > 1:
        if cfg.model.factory or cfg.model.name != "gpt":
            yield CHOICE, (f"strategy '{name}' shards the built-in GPT's attention and MLP over "
                           f"{shape.tp} tensor-parallel ranks: set model.name = 'gpt' "
                           f"(model.factory models are not split)")
            return
        heads = tp_heads_problem(cfg.model.n_head, shape.tp)
        if heads:
            yield CHOICE, heads
    if shape.pp > 1:
        yield from _pipeline_problems(cfg, shape.pp, shape.dp, name, ranks)
        if par.zero == 1 and shape.dp_shard > 1:
            yield CHOICE + ("parallel.zero",), (
                "parallel.zero = 1 is not applied to pipeline stages; use parallel.zero = 2 "
                "or 3 with pp (ZeRO shards over parallel.dp_shard)")
    if cfg.debug.slow_rank >= 0 and shape.pp > 1:
        yield CHOICE + ("debug.slow_rank",), (
            "debug.slow_rank slows a rank's backward outside a pipeline schedule, which pp "
            "does not call; set debug.slow_rank = -1 with pp")
    if par.zero != 3 and shape.dp_shard == 1 and shape.world == 1 and name == "fsdp":
        yield CHOICE + ("parallel.zero",), (
            f"parallel.zero = {par.zero} shards over fsdp's ranks, and one rank has nothing "
            f"to shard; use at least 2 devices, or leave parallel.zero at 3")
    elif par.zero != 3 and shape.dp_shard == 1:
        yield CHOICE + ("parallel.zero",), (
            f"parallel.zero = {par.zero} shards over the dp_shard dimension, and strategy "
            f"'{name}' has none (mesh {shape.describe()}); use fsdp or a mesh with "
            f"parallel.dp_shard > 1, or leave parallel.zero at 3")
    if par.zero == 1 and shape.tp > 1:
        yield CHOICE + ("parallel.zero",), (
            "parallel.zero = 1 (DDP with a sharded optimizer) does not take tensor "
            "parallelism's DTensor parameters; use parallel.zero = 2 or 3")
    if par.ac != "none" and shape.pp > 1 and cfg.model.factory:
        yield CHOICE + ("parallel.ac",), ("parallel.ac finds a model.factory's blocks in the "
                                          "whole model, not in pipeline stages; set "
                                          "parallel.ac = 'none' with pp")
    if cfg.strategy.split_weights and shape.dp != ranks:
        yield CHOICE + ("strategy.split_weights",), (
            f"strategy.split_weights shares each batch over data-parallel ranks; mesh "
            f"{shape.describe()} has {shape.dp} data-parallel group(s) of "
            f"{ranks // max(1, shape.dp)} ranks: remove it")


def _cp_problem(cfg: RunConfig, shape: MeshShape, name: str) -> Problem | None:
    """Context parallelism: the built-in GPT (its attention is the ring), a context the
    zig-zag split cuts into 2 x cp equal chunks, and the combinations gputui proves equal to
    single (beside dp_replicate, dp_shard at ZeRO-2 or 3 and tp, with activation
    checkpointing: see tests/unit/cp_ranks.py)."""
    keys = CHOICE + ("parallel.cp",)
    if cfg.model.factory or cfg.model.name != "gpt":
        return keys, (f"strategy '{name}' splits the built-in GPT's sequences over "
                      f"{shape.cp} context-parallel rank(s), its attention a ring: set "
                      f"model.name = 'gpt' (model.factory models are not split)")
    context = cp_context_problem(cfg.data.context, shape.cp)
    if context:
        return keys + ("data.context",), context
    if shape.pp > 1:
        return keys + ("parallel.pp",), (
            "parallel.cp with parallel.pp is not in gputui yet (cp composes with "
            "dp_replicate, dp_shard and tp); set parallel.pp = 1 or parallel.cp = 1")
    if cfg.parallel.zero == 1 and shape.dp_shard > 1:
        return keys + ("parallel.zero",), (
            "parallel.zero = 1 (DDP with a sharded optimizer) is not combined with cp; use "
            "parallel.zero = 2 or 3 (fully_shard over dp_shard x cp)")
    return None
MOE_STRATEGIES = ("single", "ddp", "fsdp", "mesh")  # where the mixture-of-experts GPT trains


def _moe_problems(cfg: RunConfig, devices: list[Device], name: str) -> Iterator[Problem]:
    """The mixture of experts (model.moe_*) and expert parallelism (parallel.ep): the
    built-in GPT; top_k within the experts; the strategies it trains with here (single, and
    the data-parallel points of the mesh: ddp, fsdp, mesh without tp or pp); ep carved from
    the data-parallel ranks (a divisor of them) over experts it divides."""
    m, ep = cfg.model, cfg.parallel.ep
    experts = m.moe_experts
    gpt = not m.factory and m.name == "gpt"
    if ep > 1 and not (experts and gpt):
        yield ("parallel.ep", "model.moe_experts"), (
            f"parallel.ep = {ep} shards the experts of a mixture of experts; set "
            f"model.moe_experts (e.g. {2 * ep}) with model.name = 'gpt', or leave parallel.ep "
            f"at 1")
        return
    if not experts:
        return
    if not gpt:
        yield ("model.moe_experts", "model.name"), (
            "model.moe_experts replaces the built-in GPT's MLPs; set model.name = 'gpt' "
            "(a model.factory is not changed) or model.moe_experts = 0")
        return
    if m.moe_top_k > experts:
        yield ("model.moe_top_k", "model.moe_experts"), (
            f"model.moe_top_k ({m.moe_top_k}) routes each token to more experts than "
            f"model.moe_experts ({experts}); lower it")
    if experts % ep:
        yield ("parallel.ep", "model.moe_experts"), (
            f"model.moe_experts ({experts}) does not split over parallel.ep = {ep} ranks; use "
            f"a multiple of {ep} experts")
    if cfg.run.compile != "off":
        yield ("run.compile", "model.moe_experts"), (
            "run.compile does not take the mixture of experts here (its router's token counts "
            "decide the shapes); set run.compile = 'off'")
    if name not in MOE_STRATEGIES:
        yield CHOICE + ("model.moe_experts",), (
            f"the mixture-of-experts GPT trains with {', '.join(MOE_STRATEGIES)} here, not "
            f"'{name}'; choose one of those or model.moe_experts = 0")
        return
    ranks = len(devices) * cfg.dist.nnodes
    shape = mesh_of(cfg, ranks) if name != "single" else MeshShape()
    if shape.tp > 1 or shape.pp > 1 or shape.cp > 1:
        yield CHOICE + ("model.moe_experts",), (
            f"the mixture-of-experts GPT does not take tensor, pipeline or context "
            f"parallelism here (mesh {shape.describe()}); use parallel.tp = 1, "
            f"parallel.pp = 1 and parallel.cp = 1")
        return
    if ep > 1 and shape.dp % ep:
        yield CHOICE + ("parallel.ep",), (
            f"parallel.ep = {ep} is carved from the data-parallel ranks, and strategy "
            f"'{name}' has {shape.dp} on devices.spec '{cfg.devices.spec}'; use an ep that "
            f"divides {shape.dp}, or more devices")
    if ep > 1 and shape.data_parallel == "ddp" and shape.dp_shard > 1:
        yield CHOICE + ("parallel.ep", "parallel.zero"), (
            "parallel.zero = 1's sharded optimizer would broadcast one rank's experts over "
            "another's under parallel.ep; use parallel.zero = 2 or 3")


def _ac_problem(cfg: RunConfig) -> Problem | None:
    """Activation checkpointing wraps blocks: the GPT's, or a model.factory's (named by
    strategy.fsdp_wrap or its gputui_blocks(), checked once it is built)."""
    if cfg.parallel.ac == "none" or cfg.model.factory or cfg.model.name == "gpt":
        return None
    return (("parallel.ac", "model.name"),
            f"parallel.ac checkpoints each transformer block, and model.name = "
            f"{cfg.model.name!r} has none; use model.name = 'gpt' (or a model.factory with "
            f"blocks) or set parallel.ac = 'none'")


def _pipeline_problems(cfg: RunConfig, pp: int, dp: int, name: str,
                       ranks: int) -> Iterator[Problem]:
    """pp (``pp`` ranks a pipeline, ``dp`` data-parallel groups, ``ranks`` in all: the world
    the batch scales with): a block per stage at least,
    valid split points, a slice the micro-batches divide evenly, no fp16 (its grad scaler is
    not applied to the stages' backward), enough micro-batches for the schedule, the V
    schedules (whose two stages a rank share the tied weight) without data parallelism. A
    weight tied across stages is fine: pp sums its gradients."""
    model = cfg.model.factory or cfg.model.name
    schedule = cfg.strategy.schedule
    kind = PP_PLACEMENT[schedule]
    v = stages_per_rank(schedule, cfg.strategy.stages_per_rank)
    n = pp * v
    layers = model_layers(cfg)
    stages = f"{pp} ranks" if v == 1 else f"{pp} ranks x {v} stages per rank = {n} stages"
    if layers is not None and n > layers:
        yield CHOICE, (f"strategy '{name}' cuts {model} into at most {layers} stages (one per "
                       f"block), and the pipeline asks for {stages}; use fewer devices"
                       + (" or fewer stages per rank" if v > 1 else ""))
    if cfg.strategy.split_weights:
        yield CHOICE, f"strategy.split_weights applies to scratch and ddp, not '{name}'; remove it"
    reason = check_split_points(list(cfg.strategy.split_points),
                                layers if layers is not None else 2**62, n, model)
    if reason:
        yield CHOICE + ("strategy.split_points",), reason
    batch, micro, chunks = (effective_batch_size(cfg, ranks), cfg.optim.micro_batches,
                            cfg.strategy.pipeline_chunks)
    keys = CHOICE + ("optim.batch_size", "optim.micro_batches", "strategy.pipeline_chunks")
    if batch % (dp * micro * chunks):
        groups = "each batch" if dp == 1 else f"each of the {dp} data-parallel slices"
        yield keys, (f"strategy '{name}' splits {groups} into optim.micro_batches x "
                     f"strategy.pipeline_chunks = {micro} x {chunks} equal micro-batches; "
                     f"optim.batch_size ({batch}) is not divisible by {dp * micro * chunks}")
    if cfg.run.precision == "fp16":
        yield CHOICE + ("run.precision",), (
            f"strategy '{name}' does not apply fp16's grad scaler to its stages' backward; use "
            f"run.precision = 'bf16' or 'fp32'")
    need = {"1f1b": pp, "dualpipev": n, "zbv": n}.get(schedule, 0)
    if chunks < need:  # torch's schedules refuse it
        yield CHOICE + ("strategy.pipeline_chunks", "strategy.schedule"), (
            f"strategy.schedule = {schedule!r} needs strategy.pipeline_chunks of at least the "
            f"{need} stages ({chunks} given); raise it or use strategy.schedule = 'gpipe'")
    if kind == "v" and v > 1 and chunks % pp:
        yield CHOICE + ("strategy.pipeline_chunks", "strategy.schedule"), (
            f"strategy.schedule = {schedule!r} runs the micro-batches in rounds of the {pp} "
            f"pipeline ranks: strategy.pipeline_chunks ({chunks}) must be a multiple of {pp}")
    if kind == "V" and dp > 1:
        yield CHOICE + ("strategy.schedule",), (
            f"strategy.schedule = {schedule!r} puts the first and last stage (sharing the tied "
            f"head) on one rank, which data parallelism would sync twice; use interleaved_zb "
            f"or 1f1b with data parallelism")


def _batch_problem(cfg: RunConfig, devices: list[Device], info: StrategyInfo) -> Problem | None:
    """Every worker that splits the batch (each rank of a multi-process strategy, each device
    of one that splits it in one process, else the one process) gets at least one example in
    each micro-batch."""
    micro = cfg.optim.micro_batches
    optim = ("optim.batch_size", "optim.micro_batches", "optim.scale_with_devices")
    if info.multiprocess:
        ranks = len(devices) * cfg.dist.nnodes
        batch = effective_batch_size(cfg, ranks)
        # each data-parallel group takes a slice (tensor-parallel ranks and a pipeline's
        # stages share theirs)
        groups = mesh_of(cfg, ranks).dp if info.name in MESH_STRATEGIES else ranks
        who = f"{ranks} ranks" if groups == ranks else f"{groups} data-parallel groups"
        if batch < groups * micro:
            return CHOICE + optim, (f"optim.batch_size ({batch}) must give every one of the "
                                    f"{who} at least one example per micro-batch; "
                                    f"raise the batch size")
        return None
    n = len(devices)
    batch = effective_batch_size(cfg, n)
    if info.splits_batch and batch < n * micro:
        return CHOICE + optim, (f"optim.batch_size ({batch}) must give every one of the {n} "
                                f"devices at least one example in each of its "
                                f"optim.micro_batches ({micro}); raise the batch size or lower "
                                f"micro_batches")
    if batch < micro:
        return optim, (f"optim.batch_size ({batch}) is smaller than optim.micro_batches "
                       f"({micro}); lower micro_batches")
    return None


def backend_problem(backend: str, devices: list[Device], named: str, given: str) -> str | None:
    """Why a process-group ``backend`` cannot run on ``devices`` (nccl needs CUDA), or None;
    ``named`` is how the user chose the backend, ``given`` how they chose the devices."""
    kinds = {d.kind for d in devices}
    if devices and backend_for(backend, next(iter(kinds))) == "nccl" and kinds != {"cuda"}:
        return f"{named} needs CUDA devices, {given} gives CPU ones; use 'gloo' or 'auto'"
    return None


def device_error(exc: DeviceSpecError, source: str,
                 origins: dict[str, str] | None = None) -> ConfigError:
    """A devices.spec that discovery could not meet, as the one line blaming its flag (or the
    preset, naming the key)."""
    where = blame(source, origins, "devices.spec", "devices.fallback")
    # the message quotes the value; a preset file is named with the key that holds it
    return ConfigError(f"{where}: {exc}" if where != source else f"{source}: devices.spec: {exc}")


def check_files(cfg: RunConfig, source: str, origins: dict[str, str] | None = None) -> None:
    """The files the config names exist: each factory's file and function (read and parsed,
    never run) and the checkpoint ``run.resume_from`` resumes. Reads the disk: run it once
    when a run or sweep starts, not on every keystroke."""
    for key in CODE_KEYS:
        table, name = key.split(".")
        spec = getattr(getattr(cfg, table), name)
        problem = find_problem(spec, key) if spec else None
        if problem:
            raise ConfigError(f"{blame(source, origins, key)}: {problem}")
    if cfg.data.name == "text" and cfg.data.path and not cfg.data.factory \
            and not Path(cfg.data.path).expanduser().exists():
        raise ConfigError(f"{blame(source, origins, 'data.path')}: data.path: no file or "
                          f"folder at {cfg.data.path}")
    resume = Path(cfg.run.resume_from) if cfg.run.resume_from else None
    if resume is None:
        return
    checkpoint = resume / CHECKPOINT_NAME if resume.is_dir() else resume
    if not os.path.lexists(checkpoint):  # there but not a file: ckptfile says what it is
        raise ConfigError(f"{blame(source, origins, 'run.resume_from')}: run.resume_from: no "
                          f"checkpoint at {resume}; give a run folder holding {CHECKPOINT_NAME} "
                          f"(see `gputui resume`)")
    # read through once, as data: a damaged checkpoint is refused before a run folder exists
    damage = ckptfile.problem(checkpoint)
    if damage:
        folder = checkpoint.parent
        again = (f"start the run again with `gputui run {folder / 'config.toml'}`"
                 if (folder / "config.toml").is_file() else "start the run again")
        raise ConfigError(f"{blame(source, origins, 'run.resume_from')}: run.resume_from: "
                          f"{checkpoint} {damage}; it cannot be resumed: restore the file from "
                          f"a copy, or {again}")


def blame(source: str, origins: dict[str, str] | None, *keys: str, text: str = "") -> str:
    """The flags that set the rule's ``keys`` or a key its message ``text`` names, else
    ``source``."""
    origins = origins or {}
    named = [k for k in origins if k in text]
    flags = list(dict.fromkeys(origins[k] for k in (*keys, *named) if k in origins))
    return ", ".join(flags) if flags else source
