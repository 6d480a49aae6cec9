"""`gputui bench-comm --devices cpu*2 --sizes 4K,1M,16M`: the command. It parses the sizes and
the devices, runs the measurement (:mod:`gputui.runs.comm_bench`, which spawns the measuring
process) and prints the nccl-tests style table: time per call, algbw and busbw per size.
Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from gputui.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, fail
from gputui.runs.comm_bench import run_bench

UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3,
         "GB": 1024**3}
DEFAULT_SIZES = "4K,64K,1M,4M"
MAX_SIZE = 256 << 30  # a message no device of today holds twice (the largest has 141 GB)


def register(sub) -> None:
    """Add the `bench-comm` subcommand."""
    p = sub.add_parser("bench-comm", help="allreduce bandwidth over message sizes (scratch "
                                          "and torch.distributed)",
                       description="Time allreduce for a range of message sizes and print "
                                   "time, algbw and busbw (busbw = algbw * 2(n-1)/n) the way "
                                   "nccl-tests does.")
    p.add_argument("--devices", default="cpu*2", help="device choice: cpu*2, 0,1, all, 2")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes in bytes, comma list "
                                                          "with K/M/G suffixes")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per size first")
    p.add_argument("--repeats", type=int, default=5,
                   help="times each size is timed (--iters calls each): median and spread")
    p.add_argument("--impl", default="scratch,torch", help="scratch, torch or both")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="torch.distributed backend (auto: nccl on CUDA, gloo on CPU)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench_comm)


def parse_size(text: str) -> int:
    """"4K" -> 4096, "1M" -> 1048576, "512" -> 512; ValueError with the fix otherwise."""
    m = re.fullmatch(r"\s*(\d{1,15})\s*([KMG]?B?)\s*", text.upper())
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"--sizes: '{text[:40]}' is not a size; write e.g. 4K,1M,16M")
    size = int(m.group(1)) * UNITS[m.group(2)]
    if size > MAX_SIZE:
        raise ValueError(f"--sizes: '{text}' is larger than {MAX_SIZE >> 30}G, more than any "
                         f"device's memory; write e.g. 4K,1M,16M")
    return size



def cmd_bench_comm(args) -> int:
    """``gputui bench-comm``: measure, then print the nccl-tests style table."""
    from gputui.core.devices import DeviceSpecError
    from gputui.core.signals import Interrupted
    from gputui.hw.discovery import resolve_devices

    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        devices = resolve_devices(args.devices)
    except (ValueError, DeviceSpecError) as exc:
        return fail(str(exc) if str(exc).startswith("--") else f"--devices: {exc}")
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    bad = [i for i in impls if i not in ("scratch", "torch")]
    if bad or not impls:
        return fail(f"--impl: '{','.join(bad) or args.impl}' is not known; use scratch, torch "
                     f"or scratch,torch")
    if not sizes:
        return fail("--sizes: give at least one size, e.g. 4K,1M")
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        return fail("--iters and --repeats must be at least 1 and --warmup at least 0")
    if not 0 < args.timeout < float("inf"):  # nan fails both comparisons
        return fail(f"--timeout {args.timeout}: give a number of seconds above 0")
    if len(devices) < 2:
        return fail(f"--devices {args.devices}: allreduce needs at least 2 devices; "
                     f"e.g. --devices cpu*2")
    from gputui.plan import backend_problem

    nccl = backend_problem(args.backend, devices, "--backend nccl", f"--devices {args.devices}")
    if nccl and "torch" in impls:
        return fail(nccl)
    print(f"bench-comm: timing allreduce ({', '.join(impls)}) over "
          f"{', '.join(d.name for d in devices)} at {len(sizes)} size(s) ...", file=sys.stderr,
          flush=True)
    try:
        result = run_bench(devices, sizes, args.iters, args.warmup, impls, args.backend,
                           args.timeout, args.repeats)
    except KeyboardInterrupt:
        print("bench-comm interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Interrupted as exc:  # the stop contract: its processes killed, nothing kept
        from gputui.cli.common import interrupted

        return interrupted(exc.signum, ": the benchmark's processes were ended; nothing "
                                       "measured is kept")
    if "torch" in result and "error" not in result:
        from gputui.runs.predict.comm_peak import PEAK_MIN_BYTES, keep

        try:  # the peak is kept per machine, for the runs' achieved bandwidth to be shown against
            if keep(result, devices[0].kind) is None:
                print(f"gputui: no peak kept for this machine: no size of "
                      f"{PEAK_MIN_BYTES // 2**10} KiB or more was measured (a smaller call "
                      f"takes its latency, not the link's bandwidth)", file=sys.stderr)
        except OSError as exc:
            print(f"gputui: the bench-comm peak was not kept: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print_table(result)
    if "error" in result:
        print(f"gputui: bench-comm failed: {result['error']}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


NOISY_SPREAD = 0.5  # a row whose repeats spread over this share of their median is noise


def print_table(result: dict[str, Any]) -> None:
    """The nccl-tests layout: size, count, type, time (us: the median of the repeats, their
    min, max and spread), algbw and busbw (GB/s, from the median)."""
    from gputui.core.machine import note

    devs = ", ".join(result.get("devices") or [])
    for impl, title in (("scratch", "scratch allreduce (one process, replicas)"),
                        ("torch", f"torch.distributed all_reduce ({result['backend']}, one "
                                  f"process per device)")):
        if impl not in result:
            continue
        print(f"# {title} on {devs}")
        print(f"#{'size':>12} {'count':>12} {'type':>7} {'time':>10} {'min':>10} {'max':>10}"
              f" {'spread':>7} {'algbw':>8} {'busbw':>8}")
        print(f"#{'(B)':>12} {'(elements)':>12} {'':>7} {'(us, med)':>10} {'(us)':>10} "
              f"{'(us)':>10} {'':>7} {'(GB/s)':>8} {'(GB/s)':>8}")
        for r in result[impl]:
            spread = f"{r['spread']:.0%}" if r.get("spread") is not None else "-"
            print(f" {r['size']:>12} {r['count']:>12} {'float':>7} {r['time_us']:>10.1f} "
                  f"{r.get('min_us', r['time_us']):>10.1f} {r.get('max_us', r['time_us']):>10.1f}"
                  f" {spread:>7} {r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f}")
        print()
    reps = next((r.get("repeats") for rows in (result.get("scratch"), result.get("torch"))
                 for r in rows or () if r.get("repeats")), None)
    if reps:
        print(f"# each size timed {reps} times: the median, min, max and spread (max - min "
              f"over the median) of the time per call")
    wide = [(impl, r) for impl in ("scratch", "torch") for r in result.get(impl) or ()
            if (r.get("spread") or 0) > NOISY_SPREAD]
    if wide:
        impl, r = max(wide, key=lambda ir: ir[1]["spread"])
        print(f"# noisy: {len(wide)} row(s) spread over {NOISY_SPREAD:.0%} of their median "
              f"(the widest {r['spread']:.0%}, {impl} at {r['size']} B): their bandwidths are "
              f"no steady figure; raise --iters or --repeats, or measure on a quieter machine")
    line = note(result.get("machine"))
    if line:
        print(f"# {line}: these figures are not the hardware's")
