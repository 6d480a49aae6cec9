"""Whether a kept prediction input can be trusted: when and under what load it was measured
(its name is its key's, ``predict_cache.ComputeKey.name`` / ``CommKey.name``). Torch-free.
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

