"""A kept prediction input as the user reads it: whether it can be trusted (when and under
what load it was measured) and its name. Torch-free.
"""

from __future__ import annotations


def stale(entry: dict | None) -> str | None:
    """Why a kept figure must be measured again (None: trusted, or nothing kept)."""
    if entry is None:
        return None
    machine = entry.get("machine")
    if not isinstance(machine, dict) or "measured_t" not in entry:
        return "kept without when and under what load it was measured"
    if machine.get("contended"):
        return "measured while other processes used the machine"
    if "step_time_s" in entry:  # a compute figure: its threads waited as runs now wait?
        from gputui.core.ompwait import child_policy

        waited = str(entry.get("omp_wait") or "active (not recorded)").split(" ")[0]
        if waited != child_policy():
            return (f"measured with threads waiting {waited}, and runs now wait "
                    f"{child_policy()} (OMP_WAIT_POLICY)")
    return None


def input_label(key: str) -> str:
    """A kept figure's key as the input it is: "compute single, batch 64, 2 threads, 1
    copy" or "allreduce of 1.23 MiB over 2 devices"."""
    parts = key.split("|")
    if parts[0] == "compute" and len(parts) >= 10:
        strategy = parts[10].removesuffix("@1") if len(parts) > 10 else "single"
        copies = parts[8][1:]
        batch, _, micro = parts[6][1:].partition("/")
        batch += f" in {micro} micro-batches" if micro else ""
        return (f"compute {strategy}, batch {batch}, {parts[7][1:]} threads, {copies} "
                f"cop{'y' if copies == '1' else 'ies'} on {parts[9]}")
    if parts[0] == "comm" and len(parts) >= 4:
        size = int(parts[3]) if parts[3].isdigit() else 0
        what = "fsdp collectives" if ":fsdp" in parts[1] or parts[1].startswith("fsdp") else \
            f"allreduce of {size / 2**20:.2f} MiB"
        return f"{what} over {parts[2][1:]} devices"
    return key
