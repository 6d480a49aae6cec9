"""The one place that knows a rank's identity in a multi-process run (ddp, fsdp).

Torch's elastic agent tells each rank who it is through the environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK); :meth:`RankInfo.of_process` reads it, falling back
to the rank and world size a caller gives (a test or a benchmark that starts its processes
itself). ``ranks.rank_main`` builds one for ``worker.execute``; the ddp strategy reads the same
constructor for its device and node. Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a multi-process run."""

    rank: int  # global rank, 0 .. world_size - 1
    local_rank: int  # rank on this node: the index of this rank's device in the node's list
    world_size: int  # ranks in the whole job
    local_world_size: int  # ranks on this node (one per local device)
    node: int = 0  # this node's number (GROUP_RANK; rank // local_world_size)

    @classmethod
    def of_process(cls, local_devices: int, rank: int = 0, world_size: int = 1,
                   env: Mapping[str, str] | None = None) -> "RankInfo":
        """This process's identity from the elastic agent's variables in ``env`` (default
        ``os.environ``); a variable that is not set comes from ``rank``, ``world_size`` and
        ``local_devices`` (the devices this node trains on, one rank each)."""
        env = os.environ if env is None else env
        rank = int(env.get("RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", max(1, local_devices)))
        return cls(rank=rank, local_rank=int(env.get("LOCAL_RANK", rank % local_world)),
                   world_size=int(env.get("WORLD_SIZE", world_size)),
                   local_world_size=local_world,
                   node=int(env.get("GROUP_RANK", rank // local_world)))
