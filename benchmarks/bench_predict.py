"""Predicted against measured: ddp (or fsdp) on two CPU ranks for LeNet, the MLP and ResNet-18.

    .venv/bin/python benchmarks/bench_predict.py [--models lenet,mlp,resnet18] [--rounds 1]
        [--strategy ddp] [--devices 2]

For each model it measures the prediction's inputs from scratch, in this invocation, into a
fresh cache (``gputui.runs.predict.measure``: one single-device run on the whole batch, N
one-rank runs of the strategy at once on B/N each with the threads a rank gets, an allreduce
of the gradient bytes), predicts the step time of ``--strategy`` on ``--devices`` CPU ranks
(``gputui.runs.predict.scaling``), then trains that strategy for real, as users run it (launcher, elastic
agent, gloo ranks), for about as long (at least 100 steps, epochs of 100 up to ~1 s), and
reads its steady step time (warm-up excluded, ``gputui.core.steady``). It prints predicted,
measured and their ratio (goal: within 15 %, i.e. 0.85 to 1.15), and beside it the ratio the
previous model gives in the same round (N ``single`` runs' t_c in place of the strategy's own
t_own) and, for fsdp, the ratio with the older comm term (1.5 t_ar in place of the measured
t_fsdp). The ratio of speedups equals the inverse ratio of step times (both divide the same
measured one-device rate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

MODELS = {  # per-model batch: ResNet-18 is slow on a CPU (about 100 images/s on 2 cores)
    "lenet": {"optim.batch_size": 256},
    "mlp": {"optim.batch_size": 256},
    "resnet18": {"optim.batch_size": 16},
}


def base_config(model: str):
    from gputui.core.config import RunConfig, apply_overrides

    sets = {"model.name": model, "model.init": "default", "data.name": "synthetic",
            "optim.momentum": 0.9, "optim.lr": 0.01, "run.checkpoint": False,
            "run.log_every": 10,
            "telemetry.enabled": False, **MODELS[model]}
    return apply_overrides(RunConfig(), [("bench", k, v) for k, v in sets.items()])


def measured(cfg, strategy: str, n: int, runs_dir: Path, epochs: int = 1) -> dict:
    """Train ``strategy`` on cpu*n with the data size of the prediction's measurements."""
    from gputui.core import runstore
    from gputui.core.config import apply_overrides
    from gputui.runs.launcher import launch
    from gputui.runs.predict.measure import MEASURE_STEPS

    b = cfg.optim.batch_size
    run = apply_overrides(cfg, [("bench", k, v) for k, v in {
        "strategy.name": strategy, "devices.spec": f"cpu*{n}", "run.epochs": epochs,
        "run.log_every": 10, "data.train_size": b * MEASURE_STEPS,
        "data.test_size": min(b, 256)}.items()])
    handle = launch(run, runs_dir)
    while not handle.done:
        handle.poll(timeout=0.2)
    summary = runstore.read_summary(handle.run_dir)
    if summary.get("status") != "finished" or not summary.get("steady"):
        raise SystemExit(f"{strategy} run {handle.run_id} ended {summary.get('status')}: "
                         f"{summary.get('reason')}")
    return summary["steady"]


def one_round(model: str, strategy: str, n: int, work: Path) -> dict:
    from dataclasses import replace

    from gputui.runs.predict.scaling import predict
    from gputui.runs.predict.cache import Cache
    from gputui.runs.predict.measure import Measurer, epochs_for

    cfg = base_config(model)
    cache = Cache(work / f"cache-{model}.json")  # fresh: everything measured in this round
    m = Measurer(cfg, "cpu", work / "runs", line=lambda s: print(s, file=sys.stderr),
                 cache=cache, again=True)
    inp = m.inputs(n, [strategy])
    p = predict(strategy, inp)
    # the previous model, in the same round: single's compute in place of the strategy's own
    c = m.compute(max(1, inp.batch // n), max(1, m.cores // n), n)
    old = predict(strategy, replace(inp, t_own={}, t_c=c["step_time_s"]))
    # fsdp's previous comm term, in the same round: 1.5 t_ar in place of the measured t_fsdp
    prev = predict(strategy, replace(inp, t_fsdp=None)) if strategy == "fsdp" else None
    steady = measured(cfg, strategy, n, work / "runs", epochs_for(p.step_time_s))
    ratio = p.step_time_s / steady["step_time_s"]
    return {"model": model, "strategy": strategy, "devices": n,
            "batch": cfg.optim.batch_size, "t_1_ms": inp.t_1 * 1e3,
            "t_own_ms": inp.t_own[strategy] * 1e3, "t_c_ms": c["step_time_s"] * 1e3,
            "t_ar_ms": inp.t_ar * 1e3, "t_sync_ms": inp.t_sync * 1e3,
            "predicted_ms": p.step_time_s * 1e3, "measured_ms": steady["step_time_s"] * 1e3,
            "measured_noise": steady["noise"], "measured_steps": steady["steps"],
            "ratio": ratio, "within_15pct": abs(ratio - 1) <= 0.15,
            "old_ratio": old.step_time_s / steady["step_time_s"],
            "t_fsdp_ms": None if inp.t_fsdp is None else inp.t_fsdp * 1e3,
            "ratio_1p5_t_ar": prev.step_time_s / steady["step_time_s"] if prev else None,
            "predicted_speedup": p.speedup,
            "measured_speedup": (inp.t_1 / steady["step_time_s"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="lenet,mlp,resnet18")
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gputui-bench-predict-") as tmp:
        for r in range(args.rounds):
            for model in [m.strip() for m in args.models.split(",") if m.strip()]:
                row = one_round(model, args.strategy, args.devices, Path(tmp))
                row["round"] = r + 1
                rows.append(row)
                comm = (f"t_fsdp {row['t_fsdp_ms']:.2f}" if row["t_fsdp_ms"] is not None
                        else f"t_ar {row['t_ar_ms']:.2f}")
                prev = ("" if row["ratio_1p5_t_ar"] is None else
                        f"; with 1.5 t_ar in place of t_fsdp: {row['ratio_1p5_t_ar']:.3f}")
                print(f"{model:9} {args.strategy}@cpu*{args.devices} batch {row['batch']}: "
                      f"predicted {row['predicted_ms']:.2f} ms/step (t_own {row['t_own_ms']:.2f}"
                      f" + {comm} + t_sync/10 {row['t_sync_ms'] / 10:.2f}), "
                      f"measured {row['measured_ms']:.2f} ms/step over {row['measured_steps']} "
                      f"steps (±{(row['measured_noise'] or 0):.0%}): predicted/measured "
                      f"{row['ratio']:.3f} {'(within 15 %)' if row['within_15pct'] else '(OUT)'}"
                      f"; with single's t_c {row['t_c_ms']:.2f} in place of t_own: "
                      f"{row['old_ratio']:.3f}; speedup predicted "
                      f"{row['predicted_speedup']:.2f}x, measured "
                      f"{row['measured_speedup']:.2f}x{prev}", flush=True)
    from gputui.core.steady import spread

    for model in dict.fromkeys(r["model"] for r in rows):
        sp = spread([r["ratio"] for r in rows if r["model"] == model])
        old = spread([r["old_ratio"] for r in rows if r["model"] == model])
        print(f"{model:9} predicted/measured over {sp['n']} round(s): median {sp['median']:.3f} "
              f"(range {sp['min']:.3f}-{sp['max']:.3f}); single's t_c in place of t_own: "
              f"median {old['median']:.3f} (range {old['min']:.3f}-{old['max']:.3f})")
        prev = [r["ratio_1p5_t_ar"] for r in rows if r["model"] == model
                and r["ratio_1p5_t_ar"] is not None]
        if prev:
            pv = spread(prev)
            print(f"{model:9} with 1.5 t_ar in place of t_fsdp: median {pv['median']:.3f} "
                  f"(range {pv['min']:.3f}-{pv['max']:.3f})")
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    # its runs' records in a folder of the benchmark's, removed after it
    with tempfile.TemporaryDirectory(prefix="gputui-bench-predict-runs-") as records:
        os.environ.setdefault("GPUTUI_RUNS_DIR", records)
        main()
