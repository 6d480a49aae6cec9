"""gputui's `ddp` (2 CPU ranks, 1 thread each) against `single` (2 threads), and ddp's start-up.

    .venv/bin/python benchmarks/bench_ddp.py [--device cpu|cuda] [--rounds 2] [--epochs 3]
        [--batch-size 256]

``--device cuda``: one rank per visible GPU (nccl) against `single` on the first GPU; the
"2 ranks" below are then that many GPU ranks.

Throughput: LeNet on the synthetic set (12,000 examples), the same config for both; `single`
runs in this process (the loop, as a run does), `ddp` as users run it (launcher -> elastic
agent -> 2 ranks). Each round trains ``--epochs`` epochs; the first is warm-up and not
counted; samples/s is training time only (evaluation excluded). Rounds alternate
(single, ddp, single, ddp ...); medians and the ratio ddp / single are printed (target 1.05).

Reference: a hand-written DDP loop (benchmarks/plain.py: its own model and batching, the same
data, seed and batch order; 2 ranks x 1 thread) through the same elastic launcher, so the overhead of gputui's ddp shows apart from the machine's.
Ceiling: the same two ranks with no communication at all (each trains its shard alone), the
most two 1-thread processes can do on this machine; where intra-op threads already scale well
(2 threads ~ 2x 1 thread), that ceiling, not DDP, limits the ratio.

Start-up: launch to the first step of ddp (InitDone: process start, torch import, rendezvous,
process group, data and model), against a bare 2-rank elastic launch whose ranks import torch,
join a gloo group and all-reduce once, measured here the same way (target: under 4 s).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

from gputui.core.config import RunConfig, apply_overrides


def config(strategy: str, spec: str, threads: int, epochs: int, batch: int) -> RunConfig:
    return apply_overrides(RunConfig(), [("bench", k, v) for k, v in {
        "strategy.name": strategy, "devices.spec": spec, "run.threads": threads,
        "run.epochs": epochs, "optim.batch_size": batch, "model.init": "default",
        "optim.momentum": 0.9, "run.log_every": 20, "data.train_size": 12_000,
        "data.test_size": 2_000, "run.checkpoint": False, "telemetry.enabled": False}.items()])


def steady(ends: list) -> float:
    """samples/s over the epochs after the first."""
    rest = ends[1:]
    return sum(e.samples_per_s * e.seconds for e in rest) / sum(e.seconds for e in rest)


def single_round(cfg: RunConfig, device: str = "cpu") -> float:
    """`single` through the loop in this process (its threads set by the config)."""
    import torch

    from gputui.core.devices import Device
    from gputui.train.data import load_dataset, make_batches
    from gputui.train.loop import train
    from gputui.train.strategies.single import Single

    torch.set_num_threads(cfg.run.threads)
    ds = load_dataset("synthetic", train_size=cfg.data.train_size, test_size=cfg.data.test_size)
    strategy = Single(cfg, [Device(device, 0)], ds.in_channels, ds.image_size, ds.num_classes)
    strategy.setup()
    batches = make_batches(ds, strategy.batch_size, cfg.run.seed, strategy.data_device())
    ends: list = []
    train(cfg, strategy, batches, ds, lambda ev: ends.append(ev) if ev.kind == "epoch_end"
          else None, lambda: False)
    return steady(ends)


def ddp_round(cfg: RunConfig) -> tuple[float, float]:
    """(steady samples/s, seconds from launch to the first step) of a real ddp run."""
    from gputui.runs.launcher import launch

    handle = launch(cfg, "/tmp/gputui-bench-runs")
    ends, init_s = [], None
    while not handle.done:
        for ev in handle.poll(timeout=0.2):
            if ev.kind == "init_done":
                init_s = ev.seconds
            elif ev.kind == "epoch_end":
                ends.append(ev)
            elif ev.kind == "run_failed":
                raise SystemExit(f"ddp run failed: {ev.reason}")
    return steady(ends), init_s


def _plain_rank(epochs: int, batch: int, sync: bool = True, device: str = "cpu") -> float:
    """A hand-written DDP loop (the reference, benchmarks/plain.py): same data, seed and batch
    order, 1 thread. With ``sync=False`` the ranks never communicate: the machine's ceiling."""
    import os
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plain

    from gputui.train.data import load_dataset

    torch.set_num_threads(1)
    cuda = device == "cuda"
    dev = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = load_dataset("synthetic", train_size=12_000, test_size=2_000)
    wrap = None
    if sync:
        def wrap(m):
            return DistributedDataParallel(m, device_ids=[dev.index] if cuda else None)
    sps, _ = plain.train(ds.train_x, ds.train_y, dev, batch, epochs, lr=0.1, momentum=0.9,
                         shard=(rank, world), wrap=wrap)
    dist.barrier()
    time.sleep(0.1)  # see strategies.rank.destroy_group
    dist.destroy_process_group()
    return sps


def _ceiling_rank(epochs: int, batch: int, device: str = "cpu") -> float:
    """Each rank trains its shard with no gradient sync at all (not a correct job: a bound)."""
    return _plain_rank(epochs, batch, sync=False, device=device)


def _bare_rank(t0: float) -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    ready = time.time() - t0
    dist.destroy_process_group()
    return ready


def _agent(fn, args: tuple, out, nproc: int = 2) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gputui.train.agent import free_port

    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d",
                       rdzv_endpoint=f"127.0.0.1:{free_port()}", run_id="bench",
                       rdzv_configs={"is_host": True}, max_restarts=0, start_method="spawn",
                       monitor_interval=0.1)
    results = elastic_launch(cfg, fn)(*args)
    if fn is _plain_rank:
        out.put(results[0])
    elif fn is _ceiling_rank:  # unsynchronised ranks: the slower one bounds a real job
        out.put(min(results.values()))
    else:
        out.put(max(results.values()))


def elastic(fn, *args, nproc: int = 2) -> float:
    """Run ``fn`` on ``nproc`` elastic ranks from a fresh process; rank 0's (or the slowest)
    value."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_agent, args=(fn, args, out, nproc))
    proc.start()
    value = out.get(timeout=600)
    proc.join()
    return value


def bare_launch() -> float:
    """Seconds from starting a process to 2 elastic ranks that have all-reduced once."""
    return elastic(_bare_rank, time.time())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    nproc = 2
    if args.device == "cuda":
        import torch

        nproc = torch.cuda.device_count()
        if nproc == 0:
            raise SystemExit("--device cuda: torch sees no CUDA device here")
    spec = "cpu*2" if args.device == "cpu" else ",".join(str(i) for i in range(nproc))
    single_cfg = config("single", "cpu" if args.device == "cpu" else "0", 2, args.epochs,
                        args.batch_size)
    ddp_cfg = config("ddp", spec, 1, args.epochs, args.batch_size)
    res: dict[str, list[float]] = {"single": [], "ddp": [], "plain_ddp": [], "ddp_start": [],
                                   "bare_start": [], "ceiling": []}
    for r in range(args.rounds):
        res["single"].append(single_round(single_cfg, args.device))
        sps, start = ddp_round(ddp_cfg)
        res["ddp"].append(sps)
        res["ddp_start"].append(start)
        res["plain_ddp"].append(elastic(_plain_rank, args.epochs, args.batch_size, True,
                                        args.device, nproc=nproc))
        res["bare_start"].append(bare_launch())
        res["ceiling"].append(elastic(_ceiling_rank, args.epochs, args.batch_size, args.device,
                                      nproc=nproc))
        print(f"round {r + 1}: single {res['single'][-1]:7,.0f}  ddp {sps:7,.0f}  plain DDP "
              f"loop {res['plain_ddp'][-1]:7,.0f} samples/s   ddp launch->first step "
              f"{start:.2f} s, bare elastic launch {res['bare_start'][-1]:.2f} s, 2 ranks "
              f"without any sync {res['ceiling'][-1]:7,.0f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    ratio = med["ddp"] / med["single"]
    print(f"median: ddp (2 ranks x 1 thread) {med['ddp']:,.0f} samples/s, single (2 threads) "
          f"{med['single']:,.0f} samples/s, ratio {ratio:.3f} (target >= 1.05; LeNet, batch "
          f"{args.batch_size})")
    print(f"median: hand-written DDP loop {med['plain_ddp']:,.0f} samples/s, ratio to single "
          f"{med['plain_ddp'] / med['single']:.3f}; gputui ddp / hand-written "
          f"{med['ddp'] / med['plain_ddp']:.3f}")
    print(f"median: 2 ranks with no communication at all (this machine's ceiling for 2 ranks) "
          f"{med['ceiling']:,.0f} samples/s, ratio to single {med['ceiling'] / med['single']:.3f}; "
          f"gputui ddp reaches {med['ddp'] / med['ceiling']:.3f} of it")
    print(f"median: ddp launch to first step {med['ddp_start']:.2f} s (target < 4 s), bare "
          f"2-rank elastic launch {med['bare_start']:.2f} s, ratio "
          f"{med['ddp_start'] / med['bare_start']:.2f}")
    if args.json:
        print(json.dumps(dict(med, ratio=ratio)))


if __name__ == "__main__":
    main()
