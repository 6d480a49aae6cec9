"""A node of a multi-node run that went away (its machine died, lost power or the network):
the failure the surviving nodes see is their backend's raw line (gloo: ``Connection reset by
peer [10.77.0.2]:24271``; NCCL: ``remote process exited or there was a network error``). The
host turns it into what the user needs (:func:`explain`): which node went away, when, the
last checkpoint, and the command that resumes it. The host knows what it recorded (its last
step) and the checkpoint it left; the peer's address is in the backend's line. Child side;
torch only to read the checkpoint's position (lazily, without loading its tensors).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from gputui.core.events import Event, RunFailed, StepMetrics
from gputui.hw.netaddr import own_addresses

# the words gloo and NCCL use for a peer whose connection ended under them
PEER_LOST = ("Connection reset by peer", "Connection closed by peer",
             "Connection closed by remote peer", "Broken pipe", "remote process exited",
             "Connection refused")
_ADDRESS = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+|\b(\d{1,3}(?:\.\d{1,3}){3})[<:]\d+")


def peer_address(text: str) -> str | None:
    """The peer's address a backend's line names ("[10.77.0.2]:24271", "10.0.0.2<43111>")."""
    m = _ADDRESS.search(text)
    return (m.group(1) or m.group(2)) if m else None


def lost_peer(text: str) -> bool:
    return any(words in text for words in PEER_LOST)


def explain(end: RunFailed, cfg: Any, run_dir: Path, run_id: str,
            recorded: Sequence[Event]) -> RunFailed:
    """``end`` (the ranks' failure) said as a node that went away, when it is one: a run of
    several nodes whose failure is a lost peer. The backend's line stays in the detail."""
    if cfg.dist.nnodes < 2 or not lost_peer(end.reason):
        return end
    address = peer_address(end.reason)
    if address and address in own_addresses():  # a rank of this node: not a node gone
        return end
    if cfg.dist.nnodes == 2:  # the only other node
        who = f"node {1 - cfg.dist.node_rank}"
    else:
        who = "a node"
    who += f" ({address})" if address else ""
    steps = [e for e in recorded if isinstance(e, StepMetrics)]
    when = (f" at epoch {steps[-1].epoch} after step {steps[-1].step}" if steps
            else " before the first step was recorded")
    reason = f"{who} went away{when}"
    checkpoint = Path(run_dir) / "checkpoint.pt"
    slurm = "SLURM_STEP_ID" in os.environ and "SLURM_JOB_ID" in os.environ  # an srun task
    if checkpoint.is_file() and slurm:  # every node resumes this record (a shared runs folder)
        reason += (f"; the last checkpoint is {checkpoint}{_position(checkpoint)}; resume it "
                   f"with `srun gputui resume {run_id}` on {cfg.dist.nnodes} nodes (in an "
                   f"allocation, or as an sbatch job's step)")
    elif checkpoint.is_file():
        reason += (f"; the last checkpoint is {checkpoint}{_position(checkpoint)}; once every "
                   f"node is back, resume with `gputui resume {run_id}` here and `gputui "
                   f"resume` of its own run on each other node")
    elif slurm:
        reason += "; no checkpoint was written yet: submit the job again"
    else:
        reason += "; no checkpoint was written yet: start the job again on every node"
    return RunFailed(reason=reason, detail=f"{end.reason}\n{end.detail}".strip())


def _position(path: Path) -> str:
    """" (epoch 2, step 8)": where the checkpoint resumes, read without its tensors."""
    try:
        import torch

        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        pos = data["position"]
        if pos.get("epoch_done"):
            return f" (end of epoch {pos['epoch']})"
        return f" (epoch {pos['epoch']} step {pos['step']})"
    except Exception:  # noqa: BLE001 - the position only helps the message
        return ""
