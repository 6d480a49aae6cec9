"""`gputui devices`: the device table (GPUs through NVML, the CPU line) or its JSON form.

``register(subparsers)`` adds the subcommand; ``run(args)`` is its handler. ``--spec SPEC``
also shows what a device choice resolves to, or its one-line error (exit status 2).
Never imports torch and never initialises CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from gputui.core.devices import (Device, DeviceSpecError, GpuInfo, human_bytes, no_gpu_sentence,
                            parse_spec)
from gputui.hw.discovery import busy_warnings, discover_gpus

EXIT_BAD_SPEC = 2


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `devices` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "devices", help="list GPUs and CPU virtual devices, with live figures",
        description="List the GPUs training can use (CUDA numbering, CUDA_VISIBLE_DEVICES "
                    "applied), their memory, utilization, temperature, power and processes, "
                    "and the CPU. Reads GPUs through NVML only.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--spec", metavar="SPEC",
                   help="also show what a device choice resolves to: 'cpu*2', '0,2', 'all', "
                        "'2', 'cuda:*'")
    p.set_defaults(func=run)
    return p


def _gather(spec: str | None) -> tuple[dict, int, list[GpuInfo]]:
    from gputui.hw import nvml
    from gputui.hw.procstat import host_summary

    gpus, reason = discover_gpus()
    notes = list(nvml.order().notes) if nvml.init() else []
    data: dict = {
        "gpus": [g.to_dict() for g in gpus],
        "cpu": host_summary(),
        "no_gpu_reason": None if gpus else no_gpu_sentence(reason),
        "driver": nvml.driver_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "notes": notes,
    }
    status = 0
    if spec is not None:
        try:
            devices = parse_spec(spec, gpus, reason)
        except DeviceSpecError as exc:
            data["spec"] = {"input": spec, "error": str(exc)}
            status = EXIT_BAD_SPEC
        else:
            data["spec"] = {"input": spec, "devices": [d.to_dict() for d in devices],
                            "warnings": busy_warnings(devices, gpus)}
    return data, status, gpus


def run(args: argparse.Namespace) -> int:
    """Print the device table (or JSON); 2 when --spec cannot be satisfied."""
    data, status, gpus = _gather(getattr(args, "spec", None))
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2))
    else:
        _print_table(data, gpus)
    if status:  # the table or JSON says it too; stderr has the one line scripts look for
        from gputui.cli.common import fail

        return fail(f"--spec: {data['spec']['error']}")
    return status


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def mem_pair(used: int | None, total: int | None) -> str:
    """"1.5/16.0 GiB": both in the unit of the total, so the pair reads at a glance."""
    if total is None:
        return f"{human_bytes(used)}/n/a"
    unit, scale = "B", 1
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if total >= 1024 * scale:
            unit, scale = u, scale * 1024
    used_s = "n/a" if used is None else f"{used / scale:.1f}"
    return f"{used_s}/{total / scale:.1f} {unit}"


def power_pair(draw: float | None, limit: float | None) -> str:
    """"120/300 W"; n/a for a value NVML does not give."""
    if draw is None and limit is None:
        return "n/a"
    d = "n/a" if draw is None else f"{draw:.0f}"
    lim = "n/a" if limit is None else f"{limit:.0f}"
    return f"{d}/{lim} W"


def gpu_cells(g: GpuInfo) -> list[str]:
    """The table cells of one GPU."""
    procs = "; ".join(p.describe() for p in g.processes) or "-"
    return [f"cuda:{g.index}", "-" if g.nvml_index is None else str(g.nvml_index), g.name,
            mem_pair(g.mem_used, g.mem_total), _pct(g.util),
            "n/a" if g.temp_c is None else f"{g.temp_c:.0f}°C",
            power_pair(g.power_w, g.power_limit_w), "busy" if g.busy else "free", procs]


def cpu_line(cpu: dict) -> str:
    """One line on the host CPU and RAM."""
    phys = f", {cpu['cores_physical']} physical" if cpu.get("cores_physical") else ""
    load = cpu.get("load_avg")
    load_s = f", load {' '.join(str(x) for x in load)}" if load else ""
    return (f"CPU: {cpu['cores_logical']} cores{phys}, {_pct(cpu.get('cpu_percent'))} busy, "
            f"RAM {human_bytes(cpu['mem_used'])} / {human_bytes(cpu['mem_total'])} used"
            f"{load_s}")


def _print_table(data: dict, gpus: list[GpuInfo]) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Piped output has no width to respect: don't squeeze the table into 80 columns.
    console = Console(highlight=False, soft_wrap=True,
                      width=None if sys.stdout.isatty() else 160)
    if gpus:
        title = "GPUs (CUDA numbering" + (f", driver {data['driver']})" if data["driver"]
                                          else ")")
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("device", "nvml", "name", "memory", "util", "temp", "power", "state",
                    "processes"):
            table.add_column(col, no_wrap=col not in ("name", "processes"),
                             min_width=12 if col in ("name", "processes") else None)
        for g in gpus:
            row = [escape(cell) for cell in gpu_cells(g)]
            row[7] = f"[bold yellow]{row[7]}[/]" if g.busy else f"[green]{row[7]}[/]"
            table.add_row(*row)
        console.print(table)
    console.print(escape(cpu_line(data["cpu"])))
    if data["no_gpu_reason"]:
        console.print(escape(data["no_gpu_reason"]))
    for note in data["notes"]:
        console.print(f"note: {escape(note)}")
    spec = data.get("spec")
    if spec is None:
        return
    if "error" in spec:  # run() prints it, on stderr
        return
    names = ", ".join(Device(d["kind"], d["index"], d["label"]).name for d in spec["devices"])
    console.print(escape(f"'{spec['input']}' resolves to {len(spec['devices'])} device(s): "
                         f"{names}"))
    for line in spec["warnings"]:
        console.print(f"[yellow]warning:[/] {escape(line)}")
