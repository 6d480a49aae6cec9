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
    copy" or "allreduce of 1.23 MiB over 2 devices".

    Read from the key's fixed ends: the model, data and fsdp labels in its middle may hold
    ``|`` themselves (an fsdp label holds the data label), so no field is found by position
    from the front."""
    kind, _, rest = key.partition("|")
    if kind == "compute":
        parts = rest.split("|")
        strategy = "single"
        if parts and parts[-1].endswith("@1"):
            strategy = parts.pop().removesuffix("@1")
        if len(parts) >= 8:
            batch_s, threads, copies_s, device = parts[-4:]
            copies = copies_s[1:]
            batch, _, micro = batch_s[1:].partition("/")
            batch += f" in {micro} micro-batches" if micro else ""
            return (f"compute {strategy}, batch {batch}, {threads[1:]} threads, {copies} "
                    f"cop{'y' if copies == '1' else 'ies'} on {device}")
    if kind == "comm" and rest.count("|") >= 2:
        what, n, size_s = rest.rsplit("|", 2)
        size = int(size_s) if size_s.isdigit() else 0
        fsdp = what.startswith("fsdp") or what.partition(":")[2].startswith("fsdp")
        label = "fsdp collectives" if fsdp else f"allreduce of {size / 2**20:.2f} MiB"
        return f"{label} over {n.removeprefix('n')} devices"
    return key
