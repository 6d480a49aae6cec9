"""Device profiles: what the plan knows of a device it does not have (torch-free).

The GPUs come from ``devices.toml`` beside this module (every figure from a data sheet, named
in its ``source``); a user's own profile file (``--profile FILE``, the same layout) adds or
replaces entries; the CPU of this machine is a profile measured here (its matmul peak at the
threads a rank gets: the child measures it, ``gputui.train.flops``), with gloo's bandwidth
from a kept ``gputui bench-comm`` peak where there is one. :func:`parse_gpus` reads
``--gpus``: ``8xH100``, ``H100`` (one), ``2x8xH100`` (nodes x per node), ``cpu*4``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gputui.core.config import ConfigError

HERE = Path(__file__).resolve().parent
# the share of the matmul peak a training step reaches where nothing was measured: an
# assumption, shown as one (torchtitan's published Llama-3 runs on H100 reach 0.35-0.45 MFU)
DEFAULT_EFFICIENCY = 0.45
DEFAULT_LINK_EFFICIENCY = 0.8  # the share of a link's data-sheet bandwidth NCCL's busbw reaches
ALLOCATOR_HEADROOM = 0.10  # the caching allocator's fragmentation, on top of the peak
CUDA_CONTEXT_GIB = 1.0  # the CUDA context and NCCL's own buffers, per GPU


@dataclass(frozen=True)
class Profile:
    """One device kind: memory, peak FLOP/s per dtype, links, and where each figure is from."""

    name: str
    memory_gib: float
    tflops: dict[str, float]
    hbm_gbs: float = 0.0
    link_gbs: float = 0.0
    link_latency_us: float = 10.0
    net_gbs: float = 0.0
    net_latency_us: float = 25.0
    source: str = ""
    net_source: str = ""
    kind: str = "gpu"  # gpu or cpu
    efficiency: float = DEFAULT_EFFICIENCY
    efficiency_source: str = "assumption (no measured step)"
    link_source: str = "data sheet x 0.8 (assumption)"
    aliases: tuple[str, ...] = ()
    cores: int = 0  # cpu: the cores the ranks of one machine share
    # the host's cost of dispatching one operation on plain tensors and on DTensors (the CPU:
    # measured here, gputui.train.plan_trace._cpu_ops); 0: not priced (a GPU's host works
    # ahead of the device, its dispatch hidden behind the kernels it queues)
    op_s: float = 0.0
    dtensor_op_s: float = 0.0
    # the seconds a byte written by an operation without a FLOP formula takes (the CPU:
    # measured here; 0: not priced, a GPU's elementwise kernels taken into its efficiency)
    byte_s: float = 0.0
    ops_source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def memory(self) -> int:
        return int(self.memory_gib * 2**30)

    def usable(self) -> int:
        """Bytes a rank's peak may reach with the allocator's headroom (and on a GPU its
        context) taken off."""
        context = CUDA_CONTEXT_GIB * 2**30 if self.kind == "gpu" else 0
        return int((self.memory - context) / (1 + ALLOCATOR_HEADROOM))

    def peak_flops(self, dtype: str) -> float:
        return float(self.tflops.get(dtype) or self.tflops.get("fp32") or 0.0) * 1e12


def _from_table(name: str, t: dict[str, Any], origin: str) -> Profile:
    try:
        tflops = {str(k): float(v) for k, v in dict(t["tflops"]).items()}
        return Profile(name=name, memory_gib=float(t["memory_gib"]), tflops=tflops,
                       hbm_gbs=float(t.get("hbm_gbs", 0)), link_gbs=float(t.get("link_gbs", 0)),
                       link_latency_us=float(t.get("link_latency_us", 10)),
                       net_gbs=float(t.get("net_gbs", 0)),
                       net_latency_us=float(t.get("net_latency_us", 25)),
                       source=str(t.get("source", origin)),
                       net_source=str(t.get("net_source", "")),
                       efficiency=float(t.get("efficiency", DEFAULT_EFFICIENCY)),
                       efficiency_source=("given in " + origin) if "efficiency" in t
                       else "assumption (no measured step)",
                       aliases=tuple(str(a) for a in t.get("aliases", ())))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{origin}: profile [{name}] needs memory_gib and tflops = {{ bf16 = "
                          f"..., fp32 = ... }} as numbers ({exc})") from None


def load_profiles(extra: str | None = None) -> dict[str, Profile]:
    """The listed devices, then those of ``extra`` (a user's profile file), by name."""
    out = {}
    for path, origin in ((HERE / "devices.toml", "devices.toml"), (extra, extra)):
        if path is None:
            continue
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--profile {path}: cannot read it ({exc.strerror})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--profile {path}: not TOML ({exc})") from None
        for name, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{origin}: {name} must be a table [{name}] of figures")
            out[name] = _from_table(name, table, str(origin))
    return out


def _norm(s: str) -> str:
    return re.sub(r"[-_ ]", "", s).upper()


def _words(s: str) -> list[str]:
    return [w for w in re.split(r"[-_\s]+", s.upper()) if w]


def find(profiles: dict[str, Profile], name: str) -> Profile:
    """The profile a name or alias means (case and '-'/'_' ignored); ConfigError naming the
    known ones."""
    for p in profiles.values():
        if _norm(name) in {_norm(p.name), *(_norm(a) for a in p.aliases)}:
            return p
    raise ConfigError(f"--gpus: no profile for {name!r}; known: {', '.join(profiles)} (or "
                      f"describe it in a file given with --profile)")


def for_device(profiles: dict[str, Profile], label: str) -> Profile:
    """The profile of a device as CUDA and NVML name it ("NVIDIA H100 80GB HBM3", "NVIDIA
    A100-SXM4-80GB"): the one whose name or an alias is the longest run of whole words of the
    name (words split at spaces, '-' and '_', case ignored: "L4" is not a word of "L40S", nor
    "H200" of "GH200"), a form factor the name says (NVL, PCIe) counted only where the
    profile's words say it too. ConfigError where none matches."""
    words = _words(label)
    best: tuple[tuple[int, int], Profile | None] = ((0, 0), None)
    for p in profiles.values():
        for key in (_words(n) for n in (p.name, *p.aliases)):
            n = len(key)
            found = key and any(words[i:i + n] == key for i in range(len(words) - n + 1))
            size = (n, len("".join(key)))
            if (found and size > best[0]
                    and all(ff in key for ff in ("NVL", "PCIE") if ff in words)):
                best = (size, p)
    if best[1] is None:
        raise ConfigError(f"no device profile matches {label!r}; known: {', '.join(profiles)} "
                          f"(or describe it in a file given with --profile, with the device's "
                          f"name as an alias)")
    return best[1]


@dataclass(frozen=True)
class Cluster:
    """What a plan is for: ``nodes`` machines of ``per_node`` devices of ``profile``."""

    profile: Profile
    per_node: int
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.per_node * self.nodes

    def describe(self) -> str:
        n = f"{self.nodes}x" if self.nodes > 1 else ""
        return f"{n}{self.per_node}x{self.profile.name}"


def parse_gpus(text: str, nodes: int, profiles: dict[str, Profile]) -> tuple[str, int, int]:
    """(device name, per node, nodes) from ``--gpus`` ('8xH100', 'H100', '2x8xH100', 'cpu*4')
    and ``--nodes``; ConfigError (one line) otherwise."""
    text = text.strip()
    m = re.fullmatch(r"cpu(?:\*(\d+))?", text, re.I)
    if m:
        return "cpu", int(m.group(1) or 1), max(1, nodes)
    m = re.fullmatch(r"(?:(\d+)x)?(?:(\d+)x)?([A-Za-z][\w-]*)", text)
    if not m:
        raise ConfigError(f"--gpus {text}: give COUNTxDEVICE, e.g. 8xH100, 2x8xH100 or cpu*4")
    a, b, name = m.groups()
    if a and b:
        n_nodes, per = int(a), int(b)
        if nodes > 1 and nodes != n_nodes:  # (1 is --nodes' default: said either way)
            raise ConfigError(f"--gpus {text} names {n_nodes} node(s) and --nodes {nodes} "
                              f"another count: give the nodes once (2x8xH100, or 8xH100 "
                              f"--nodes 2)")
    else:
        n_nodes, per = max(1, nodes), int(a or 1)
    if per < 1 or n_nodes < 1 or per * n_nodes > 65536:
        raise ConfigError(f"--gpus {text}: the device count must be 1 to 65536")
    find(profiles, name)
    return name, per, n_nodes


BYTE_PROBE = 4 * 2**20  # the outputs' size of the elementwise operations pricing a written byte
OPS_SOURCE = ("measured here: the operations on a tiny GPT's steps, one rank and tp 2 (real "
              f"tensors), a written byte on elementwise operations into {BYTE_PROBE >> 20} MiB "
              "tensors (gputui.train.plan_trace._cpu_ops)")


def cpu_profile(peak_flops: float, cores: int, memory_bytes: int, comm: dict | None,
                ranks: int, ops: dict | None = None) -> Profile:
    """This machine's CPU as a profile: ``peak_flops`` measured here (a rank's matmul at its
    threads), its memory, gloo's bandwidth from a kept bench-comm peak (``comm``) or an
    assumption, and the cost of an operation's dispatch measured here (``ops``: op_s,
    dtensor_op_s; none priced without it)."""
    if comm and comm.get("algbw_gbps"):
        link = float(comm["algbw_gbps"])
        source = f"bench-comm peak kept on this machine ({link:.2f} GB/s algbw)"
    else:
        link, source = 1.0, "assumption (1 GB/s: no bench-comm peak kept; run gputui bench-comm)"
    return Profile(name="cpu", memory_gib=memory_bytes / 2**30,
                   tflops={"fp32": peak_flops / 1e12, "bf16": peak_flops / 1e12},
                   # gloo's small all-reduce on this kind of machine: 1.7-2.5 ms for 4 KiB
                   # (docs/development.md's bench-comm row), an assumption
                   link_gbs=link, link_latency_us=1000.0, net_gbs=link, net_latency_us=1000.0,
                   source="measured here (matmul at a rank's threads, gputui.train.flops)",
                   kind="cpu", link_source=source, cores=cores,
                   efficiency=DEFAULT_EFFICIENCY,
                   op_s=float((ops or {}).get("op_s", 0.0)),
                   dtensor_op_s=float((ops or {}).get("dtensor_op_s", 0.0)),
                   byte_s=float((ops or {}).get("byte_s", 0.0)),
                   ops_source=_ops_source(ops))


def _ops_source(ops: dict | None) -> str:
    """Where a CPU profile's cost of an operation is from ("" where none was measured)."""
    if not ops:
        return ""
    if ops.get("contended"):
        return (f"{OPS_SOURCE}; measured while other processes used the machine: measured "
                f"again by the next plan")
    return OPS_SOURCE


def with_efficiency(p: Profile, value: float, source: str) -> Profile:
    return replace(p, efficiency=value, efficiency_source=source)
