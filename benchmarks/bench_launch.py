"""Launch to first step, cold and warm: what pressing Start costs (gputui.runs.warm).

    .venv/bin/python benchmarks/bench_launch.py [--rounds 3] [--device cpu|cuda] [--preset quickstart]

Cold: ``launch`` spawns a fresh process (interpreter start, torch import, data, model). Warm:
a worker prepared beforehand, as the app prepares one while the user is on its set-up screen
(and a sweep keeps one between points), already holds torch; the run is handed to it. Rounds
alternate cold, warm; each run is stopped after its first step. Prints, per kind, the median
seconds from ``launch()`` to InitDone (ready to train) and to the first step's metrics
(log_every = 1) as the parent receives them, with InitDone's own split (import, data, model),
and the ratio warm / cold. Goal: the first step within 1.5 s of Start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from gputui.core.config import apply_overrides, load_preset
from gputui.core.presets import resolve_preset
from gputui.runs.launcher import launch
from gputui.runs import warm

RUNS = "/tmp/gputui-bench-launch"


def one(cfg) -> dict:
    """Seconds from launch() to InitDone and to the first StepMetrics, and InitDone's split."""
    t0 = time.perf_counter()
    handle = launch(cfg, RUNS)
    out: dict = {}
    while not handle.done:
        for ev in handle.poll(timeout=0.05):
            now = time.perf_counter() - t0
            if ev.kind == "init_done":
                out.update(ready_s=now, import_s=ev.import_s, data_s=ev.data_s,
                           model_s=ev.model_s)
            elif ev.kind == "step" and "first_step_s" not in out:
                out["first_step_s"] = now
                handle.stop()
            elif ev.kind == "run_failed":
                raise SystemExit(f"run failed: {ev.reason}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--preset", default="quickstart")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    changes = {"run.log_every": 1, "run.checkpoint": False, "telemetry.enabled": False}
    if args.device == "cuda":  # the preset's strategy on one GPU
        changes.update({"devices.spec": "0", "strategy.name": "single"})
    cfg = apply_overrides(load_preset(resolve_preset(args.preset)), [("bench", k, v)
                                                     for k, v in changes.items()])
    cuda = warm.cuda_indices(cfg.devices.spec)
    res: dict[str, list[dict]] = {"cold": [], "warm": []}
    for r in range(args.rounds):
        warm.close_all()  # cold: no worker waiting
        res["cold"].append(one(cfg))
        worker = warm.ensure_worker(cuda)  # what the app does when its set-up screen opens
        worker.ready.wait(300)  # the user is still choosing
        res["warm"].append(one(cfg))
        # and a second run in the same worker (a sweep's next point, the app's next Start)
        res.setdefault("warm again", []).append(one(cfg))
        print(f"round {r + 1}: " + "; ".join(
            f"{k} ready {v[-1]['ready_s']:.2f} s, first step {v[-1]['first_step_s']:.2f} s"
            for k, v in res.items()), flush=True)
    warm.close_all()
    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in res.items()}
    for k, m in med.items():
        print(f"median {k}: first step {m['first_step_s']:.2f} s after launch (ready "
              f"{m['ready_s']:.2f} s: import {m['import_s']:.2f} s, data {m['data_s']:.2f} s, "
              f"model {m['model_s']:.2f} s)")
    ratio = med["warm"]["first_step_s"] / med["cold"]["first_step_s"]
    print(f"warm / cold, launch to first step: {ratio:.2f} ({args.preset}: "
          f"{cfg.strategy.name} on {cfg.devices.spec}; goal: warm first step <= 1.5 s)")
    if args.json:
        print(json.dumps(med))


if __name__ == "__main__":
    main()
