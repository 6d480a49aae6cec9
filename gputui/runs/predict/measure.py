"""The measured inputs of a prediction (:mod:`gputui.runs.predict.scaling`), kept per machine.

Compute times come from short real ``single`` runs launched as users run them (the launcher,
spawned processes), their steady step time read from the record (warm-up excluded, see
:mod:`gputui.core.steady`); on the CPU the N copies a measurement needs run at once, each with the
threads a rank would get. Allreduce times are measured at exactly the gradient bytes, as DDP
issues them (:func:`allreduce_in_step`, below); fsdp's all-gathers and reduce-scatters at
its units' sizes, as fully_shard issues them (the same module); the scratch one by
``gputui bench-comm``. Every figure is kept in ``<cache>/predict-<machine>.json``
(``$GPUTUI_CACHE_DIR``, else ``$XDG_CACHE_HOME/gputui``, else ``~/.cache/gputui``) and measured
only when missing (or when asked to measure again), with when, where and under what load it
was measured (:mod:`gputui.hw.contention`): a figure kept without that state, or measured
while other processes used the machine, is measured again. ``Measurer.sources`` says, per
input, whether it was measured now or read from the cache, and its age. Torch-free: the
measuring happens in spawned processes.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from gputui.core.config import RunConfig
from gputui.core.config_schema import optimizer_states
from gputui.runs.predict.scaling import Inputs
from gputui.runs.predict.cache import Cache, CommKey, ComputeKey, compute_key, cores
from gputui.runs.predict.inputs import stale
from gputui.core import breakdown, runstore, signals
from gputui.core.devices import Device
from gputui.core.events import StepMetrics
from gputui.core.machine import note
from gputui.runs import comm_bench
from gputui.runs.comm_bench import run_bench
from gputui.runs.history import row_for
from gputui.runs.launcher import launch
from gputui.runs.prepare import override_checked
from gputui.runs.predict.scaling import static_bytes

SYNC_BYTES = 256  # the loop's all-reduce of a window's losses (float64s): a latency figure
MEASURE_STEPS = 100  # steps of a compute measurement's epoch (its first window is warm-up)
MEASURE_S = 1.0  # ... and more epochs of them (at most MAX_EPOCHS) where 100 steps take less
MAX_EPOCHS = 5
Line = Callable[[str], None]
Key = ComputeKey | CommKey


def epochs_for(step_s: float | None) -> int:
    """Epochs of MEASURE_STEPS steps for about MEASURE_S seconds of steps of ``step_s``
    (one where the step time is not known yet)."""
    if not step_s:
        return 1
    return max(1, min(MAX_EPOCHS, math.ceil(MEASURE_S / (MEASURE_STEPS * step_s))))


def measure_compute(cfg: RunConfig, batch: int, threads: int, copies: int, spec: str,
                    runs_dir: Path, line: Line, strategy: str = "single",
                    epochs: int = 1) -> dict:
    """Launch ``copies`` short one-device runs of ``strategy`` at once (``threads`` each, 0 =
    the share of the cores; ddp or fsdp on a world of one rank) and return the slowest
    one's steady step time, its noise, its mean exposed communication (``comm_s``, from the
    steady windows' step breakdowns; 0 for single), the parameters and (GPU) the peak device
    memory; raises RuntimeError (one line) when a run fails."""
    changes = {"strategy.name": strategy, "devices.spec": spec, "devices.fallback": "none",
               "run.threads": threads, "optim.batch_size": batch,
               "optim.scale_with_devices": False, "run.epochs": epochs, "run.log_every": 10,
               "data.train_size": batch * MEASURE_STEPS, "data.test_size": min(batch, 256),
               "run.checkpoint": False, "run.resume_from": "", "run.name": "predict-measure",
               "telemetry.enabled": False}
    ready = override_checked(cfg, [("predict", k, v) for k, v in changes.items()])
    m = ready.config  # its devices resolved once, for every copy
    handles = [launch(m, runs_dir, ready.devices, ready.note) for _ in range(copies)]
    try:
        while not all(h.done for h in handles):
            for h in handles:
                h.poll(timeout=0.1)
    except BaseException:
        for h in handles:
            h.kill("prediction measurement interrupted")
        raise
    signals.raise_if_stopped()  # its runs were stopped by a signal: no figure from them
    rows = [row_for(h.run_dir) for h in handles]
    bad = next((r for r in rows if r.status != "finished"), None)
    if bad is not None:
        raise RuntimeError(f"the measuring run {bad.id} ended {bad.status}"
                           f"{': ' + bad.reason if bad.reason else ''}")
    steady: list[runstore.SteadyFigures] = []
    for h in handles:
        got = runstore.read_summary(h.run_dir).steady
        if not got:
            raise RuntimeError("the measuring run was too short for a steady state")
        steady.append(got)
    # the slowest copy sets the pace of ranks that wait for each other
    slowest = max(range(copies), key=lambda i: steady[i].step_time_s)
    step = steady[slowest].step_time_s
    comm = _steady_comm(handles[slowest].run_dir)
    peak = _peak_memory(handles[0].run_dir)
    summary = runstore.read_summary(handles[0].run_dir)
    own = f", {comm * 1000:.2f} ms of it its own comm" if comm else ""
    mb = f" in {m.optim.micro_batches} micro-batches" if m.optim.micro_batches > 1 else ""
    line(f"  measured {copies} x {strategy}({batch} per step{mb}, {threads or 'auto'} thread(s)) "
         f"on {spec}: {step * 1000:.2f} ms per step{own}")
    return {"step_time_s": step, "noise": steady[slowest].noise, "comm_s": comm,
            "params": summary.params, "peak_mem": peak,
            "threads": summary.threads or threads, "omp_wait": summary.omp_wait}


def _steady_comm(run_dir: Path) -> float:
    """The mean exposed communication of a record's metered steps, warm-up (the first log
    window, as gputui.core.steady) left out; 0.0 where none was measured."""
    parts = [ev.breakdown for ev in runstore.read_events(run_dir)
             if isinstance(ev, StepMetrics) and ev.breakdown]
    mean = breakdown.mean(parts[1:] if len(parts) > 1 else parts)
    return float(mean.comm_exposed_s or 0.0) if mean else 0.0


def _peak_memory(run_dir: Path) -> int | None:
    """The largest allocation a GPU run reported (None on the CPU)."""
    peak = None
    for ev in runstore.read_events(run_dir):
        if not isinstance(ev, StepMetrics):
            continue
        for d in ev.per_device:
            if d.mem_alloc is not None:
                peak = max(peak or 0, int(d.mem_alloc))
    return peak


# ---------------------------------------------------------------------------------------
# The allreduce as DDP issues it, timed for the prediction (torch is imported in spawned
# processes only: the ranks are :mod:`gputui.train.comm_ranks`'s, started as bench-comm's are).
#
# ``gputui bench-comm`` times back-to-back calls, which keeps gloo's threads awake; a training
# step instead computes, then all-reduces its gradients once. Here each rank (the threads a rank
# gets) does a fixed amount of compute that takes about ``gap`` seconds, then one all_reduce of
# ``size`` bytes, and so on: the figure is the mean cycle (compute and all-reduce) less the
# slowest rank's mean compute, which is what the all-reduce adds to a step, the wait for a rank
# held up by the other processes on its cores included. Gradients above DDP's first bucket (1
# MiB) are reduced while backward still runs on every core, so for those one spinning process
# per core keeps the cores busy during the whole measurement, as training does (on busy cores a
# gloo all-reduce can take twice what it takes on idle ones, and a small one takes longer
# between compute than back to back).
#
# fsdp (``fully_shard``) issues no all-reduce but one collective per unit and pass: a unit's
# all-gather before its forward, again before its backward (every unit but the root reshards
# after forward), and a reduce-scatter of its gradients after its backward, each of the unit's
# flat (padded) parameter bytes. ``comm_ranks.fsdp_calls`` lists them in a step's order from the
# units' sizes (counted from the model itself, the way the fsdp strategy wraps it:
# ``comm_ranks.fsdp_units``), and :func:`fsdp_in_step` times that sequence between ranks with
# the step's compute cut into equal slices between the calls: on the CPU gloo runs each call on
# the training thread, so each pays its latency and waits for the slower rank, as in training.

FIRST_BUCKET = 2**20  # DDP's first bucket: a gradient this small is one call after backward
_SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


def allreduce_in_step(n: int, size: int, gap: float, kind: str, cores: int,
                      timeout: float = 600.0) -> float:
    """Seconds of one all_reduce of ``size`` bytes over ``n`` ranks between ``gap`` seconds of
    compute (cores kept busy for sizes above DDP's first bucket, on the CPU); raises
    RuntimeError (one line) on failure. No process outlives the call."""
    return _measure(n, size, gap, kind, cores, timeout)["seconds"]


def fsdp_in_step(cfg_dict: dict, n: int, gap: float, kind: str, cores: int,
                 timeout: float = 600.0) -> dict:
    """Seconds that one step's fsdp collectives (``comm_ranks.fsdp_calls`` of the configured
    model's units) add to a step of ``gap`` seconds of compute over ``n`` ranks, with their count
    (``calls``) and total bytes (``bytes``); raises RuntimeError (one line) on failure. No
    process outlives the call."""
    return _measure(n, 0, gap, kind, cores, timeout, cfg_dict)


def _measure(n: int, size: int, gap: float, kind: str, cores: int, timeout: float,
             cfg_dict: dict | None = None) -> dict:
    threads = max(1, cores // n) if kind == "cpu" else 1
    # about 2 s of steps: short steps swing, and one slow call weighs on a short mean
    iters = max(5, min(300, int(2.0 / max(gap, 1e-3))))
    busy = cores if kind == "cpu" and size > FIRST_BUCKET and cfg_dict is None else 0
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(timeout)])
                for _ in range(busy)]
    job = {"what": "in_step", "n": n, "size": size, "gap": gap, "iters": iters,
           "threads": threads, "kind": kind, "cfg": cfg_dict}
    try:
        result = comm_bench.measure(job, timeout, "gputui-predict-comm")
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    if "error" in result:
        what = "fsdp collectives" if cfg_dict is not None else "allreduce"
        raise RuntimeError(f"{what} measurement failed: {result['error']}")
    return result


def measure_comm(devices: list, size: int, gap: float, cores_: int, line: Line) -> dict:
    """Allreduce of ``size`` bytes over ``devices``, torch.distributed as DDP issues it (one
    call between ``gap`` seconds of compute, :func:`allreduce_in_step`)."""
    kind = devices[0].kind
    torch_s = allreduce_in_step(len(devices), size, gap, kind, cores_)
    busy = " with the cores busy" if kind == "cpu" and size > FIRST_BUCKET else ""
    line(f"  measured allreduce of {size / 2**20:.2f} MiB over {len(devices)} devices between "
         f"{gap * 1000:.1f} ms of compute{busy}: {torch_s * 1000:.2f} ms")
    return {"torch_s": torch_s, "gap_s": gap}


def measure_scratch(devices: list, size: int, line: Line) -> dict:
    """The scratch allreduce of ``size`` bytes over ``devices`` (inside the one training
    process, so timed on idle cores by bench-comm, with no compute between calls)."""
    scratch = run_bench(devices, [size], iters=10, warmup=5, impls=["scratch"],
                        backend="auto", timeout=600)
    if "error" in scratch:
        raise RuntimeError(f"bench-comm failed: {scratch['error']}")
    seconds = scratch["scratch"][0]["seconds"]
    line(f"  measured scratch's allreduce of {size / 2**20:.2f} MiB over {len(devices)} "
         f"devices: {seconds * 1000:.2f} ms")
    return {"scratch_s": seconds}


def measure_fsdp(cfg_dict: dict, n: int, gap: float, kind: str, cores_: int,
                 line: Line) -> dict:
    """One step's fsdp all-gathers and reduce-scatters over ``n`` ranks, issued as fully_shard
    issues them between ``gap`` seconds of compute
    (:func:`fsdp_in_step`)."""
    out = fsdp_in_step(cfg_dict, n, gap, "cuda" if kind == "gpu" else "cpu", cores_)
    line(f"  measured fsdp's {out['calls']} collectives per step ({out['bytes'] / 2**20:.2f} "
         f"MiB) over {n} ranks between {gap * 1000:.1f} ms of compute: "
         f"{out['seconds'] * 1000:.2f} ms")
    return {"torch_s": out["seconds"], "calls": out["calls"], "bytes": out["bytes"],
            "gap_s": gap}


class Measurer:
    """Gathers (from the cache, or by measuring) the inputs of a prediction."""

    def __init__(self, cfg: RunConfig, kind: str, runs_dir: Path, line: Line = print,
                 measure: bool = True, again: bool = False, cache: Cache | None = None,
                 gpu_name: str = ""):
        self.cfg, self.kind, self.runs_dir, self.line = cfg, kind, Path(runs_dir), line
        self.measure, self.again = measure, again
        self.cache = cache or Cache()
        self.cores = cores()
        self._gpu_label = ""
        self._step_s: float | None = None  # the one-device step, once known: sizes the rest
        self.baseline: dict | None = None  # t_1's figures: noise, threads, waiting, machine
        # per input: {"input", "source" ("measured now" | "cached"), "measured", "age_s",
        # "note" (its contention, or why it was measured again)}
        self.sources: list[dict[str, Any]] = []
        self._now: dict[Key, dict] = {}  # measured in this sitting: never measured twice
        if kind == "gpu" and gpu_name:  # known already (the app's last discovery)
            self._gpu_label = gpu_name
        elif kind == "gpu":
            from gputui.hw.discovery import discover_gpus

            gpus, _ = discover_gpus()
            self._gpu_label = gpus[0].name if gpus else "gpu"

    def _get(self, key: Key, fn: Callable[[], dict]) -> dict | None:
        if key in self._now:
            return self._now[key]
        hit = None if self.again else self.cache.get(key)
        why = stale(hit)
        if hit is not None and (why is None or not self.measure):
            self._source(key, hit, "cached", why or "")
            return hit
        if not self.measure:
            return None
        from gputui.hw.contention import LoadWatch, gpu_uuids

        watch = LoadWatch(gpu_uuids([Device("cuda", 0)]) if self.kind == "gpu" else ())
        value = fn()
        value = self._now[key] = dict(value, machine=watch.state())
        self.cache.put(key, value)
        self._source(key, self.cache.get(key) or value, "measured now",
                     f"measured again: {why}" if hit is not None and why else "")
        return value

    def _source(self, key: Key, entry: dict, source: str, why: str) -> None:
        if any(s["key"] == str(key) for s in self.sources):
            return
        when = entry.get("measured_t")
        age = time.time() - when if isinstance(when, (int, float)) else None
        self.sources.append({"key": str(key), "input": key.name(), "source": source,
                             "measured": entry.get("measured", ""), "age_s": age,
                             "note": "; ".join(x for x in (why, note(entry.get("machine")))
                                               if x)})

    def global_batch(self, n: int) -> int:
        b = self.cfg.optim.batch_size
        return b * n if self.cfg.optim.scale_with_devices else b

    def compute(self, batch: int, threads: int, copies: int,
                strategy: str = "single") -> dict | None:
        device = f"gpu:{self._gpu_label}" if self.kind == "gpu" else "cpu"
        spec = "0" if self.kind == "gpu" else "cpu"
        key = compute_key(self.cfg, batch, threads, copies, device, strategy)
        epochs = epochs_for(self._step_s)
        out = self._get(key, lambda: measure_compute(self.cfg, batch, threads, copies, spec,
                                                     self.runs_dir, self.line, strategy, epochs))
        if out and self._step_s is None:
            self._step_s = out["step_time_s"]
        return out

    def comm(self, n: int, size: int, gap: float) -> dict | None:
        """The allreduce of ``size`` bytes between ``gap`` seconds of compute (the gap is
        part of the key, rounded to 10 %)."""
        import math

        label = (self._gpu_label if self.kind == "gpu" else "step") + \
            f":gap{math.exp(round(math.log(max(gap, 1e-4)) / 0.1) * 0.1) * 1000:.3g}ms"
        devices = [Device("cuda" if self.kind == "gpu" else "cpu", i) for i in range(n)]
        return self._get(CommKey(self.kind, n, size, label),
                         lambda: measure_comm(devices, size, gap, self.cores, self.line))

    def scratch_comm(self, n: int, size: int) -> dict | None:
        """scratch's allreduce of ``size`` bytes (one process: no compute gap in its key)."""
        devices = [Device("cuda" if self.kind == "gpu" else "cpu", i) for i in range(n)]
        tag = f"{self._gpu_label}:scratch" if self.kind == "gpu" else "scratch"
        return self._get(CommKey(self.kind, n, size, tag),
                         lambda: measure_scratch(devices, size, self.line))

    def fsdp_comm(self, n: int, gap: float) -> dict | None:
        """One step's fsdp collectives over ``n`` ranks between ``gap`` seconds of compute
        (the model's units counted in the measuring process; model, data shape, wrap and gap
        in the key)."""
        import math

        d = self.cfg.to_dict()
        label = (f"fsdp:{self.cfg.model.label}|{self.cfg.data.label}|"
                 f"{','.join(self.cfg.strategy.fsdp_wrap)}|{self._gpu_label or 'step'}"
                 f":gap{math.exp(round(math.log(max(gap, 1e-4)) / 0.1) * 0.1) * 1000:.3g}ms")
        return self._get(CommKey(self.kind, n, 0, label),
                         lambda: measure_fsdp(d, n, gap, self.kind, self.cores, self.line))

    def inputs(self, n: int, strategies: list[str]) -> Inputs:
        """The inputs for N devices (missing figures stay None when measuring is off)."""
        on_gpu = self.kind == "gpu"
        b1, bn = self.global_batch(1), self.global_batch(n)
        one = self.baseline = self.compute(b1, 0 if on_gpu else self.cores, 1)
        inp = Inputs(n=n, on_gpu=on_gpu, batch=bn, batch_1=b1,
                     t_1=one["step_time_s"] if one else 0.0,
                     momentum=self.cfg.optim.momentum > 0,
                     optim_states=optimizer_states(self.cfg.optim),
                     log_every=self.cfg.run.log_every)
        if one is None:
            return inp
        inp.params = int(one.get("params") or 0)
        inp.grad_bytes = inp.params * 4
        if one.get("peak_mem") is not None:
            inp.activations_1 = max(0, int(one["peak_mem"]) - static_bytes(inp))
        if n == 1:
            return inp
        share = max(1, bn // n)
        threads = 0 if on_gpu else max(1, self.cores // n)
        copies = 1 if on_gpu else n
        if on_gpu:
            c = self.compute(share, threads, copies)
            inp.t_c = c["step_time_s"] if c else None
        for name in ("ddp", "fsdp"):
            if name in strategies:
                # the strategy itself on one rank: its own per-step work, not its comm
                c = self.compute(share, threads, copies, name)
                if c:
                    inp.t_own[name] = max(0.0, c["step_time_s"] - (c.get("comm_s") or 0.0))
                elif inp.t_c is None:  # figures kept before t_own was: single's, if kept
                    c = self.compute(share, threads, copies)
                    inp.t_c = c["step_time_s"] if c else None
        if "pp" in strategies:
            # a stage's compute of the whole batch: about one rank's share through the model
            inp.chunks, inp.schedule = (self.cfg.strategy.pipeline_chunks,
                                        self.cfg.strategy.schedule)
            if inp.t_c is None:
                c = self.compute(share, threads, copies)
                inp.t_c = c["step_time_s"] if c else None
        if "scratch" in strategies and not on_gpu:
            c = self.compute(share, self.cores, 1)
            inp.t_seq = c["step_time_s"] if c else None
        # the compute between two gradient syncs
        gap = inp.t_own.get("ddp") or inp.t_own.get("fsdp") or inp.t_c or inp.t_seq or inp.t_1
        # each allreduce measured only where a formula uses it: t_ar (ddp, fsdp's fallback),
        # t_copy (scratch, and dp on GPUs)
        if inp.grad_bytes and any(s in strategies for s in ("ddp", "fsdp")):
            c = self.comm(n, inp.grad_bytes, gap)
            inp.t_ar = c["torch_s"] if c else None
        if inp.grad_bytes and ("scratch" in strategies or on_gpu and "dp" in strategies):
            c = self.scratch_comm(n, inp.grad_bytes)
            inp.t_copy = c["scratch_s"] if c else None
        if "fsdp" in strategies and inp.params:
            c = self.fsdp_comm(n, inp.t_own.get("fsdp") or inp.t_c or inp.t_1)
            inp.t_fsdp = c["torch_s"] if c else None
        if "tp" in strategies:
            self.tp_inputs(inp, n, share, threads, copies)
        if any(s in strategies for s in ("ddp", "fsdp", "tp", "pp")):
            c = self.comm(n, SYNC_BYTES, gap)  # the window's losses: latency-bound
            inp.t_sync = c["torch_s"] if c else None
        return inp

    def tp_inputs(self, inp: Inputs, n: int, share: int, threads: int, copies: int) -> None:
        """tp's inputs (the built-in GPT only): t_c, and t_act, one all-reduce of the whole
        batch's B x T x E fp32 activation over N ranks between the compute of two of the
        step's 4 L all-reduces."""
        m = self.cfg.model
        if m.factory or m.name != "gpt":
            return
        if inp.t_c is None:
            c = self.compute(share, threads, copies)
            inp.t_c = c["step_time_s"] if c else None
        inp.tp_blocks = m.n_layer
        act = inp.batch * self.cfg.data.context * m.n_embd * 4
        c = self.comm(n, act, (inp.t_c or inp.t_1) / (4 * m.n_layer))
        inp.t_act = c["torch_s"] if c else None
