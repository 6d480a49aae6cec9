"""One elastic launch of a test's rank function on this machine, as gputui's own agent starts
ranks (gputui.train.agent): forked from one fork server that has imported torch, the training
path and the calling script once, not N fresh interpreters each importing them (a rank's
start-up was most of a small scenario's time: the 8-rank mesh launch of tp_ranks.py took 23 s
spawned and 10 s forked from the server, the results identical to the bit).

The server is this launching script forked once it has imported all of that and before it
has computed anything (``agent._fork_own_server``, as a run host on CPU devices does: the
script imports torch anyway, so a spawned server would import it again), else
multiprocessing's spawned one (a fresh interpreter, no threads, no CUDA context). Either way
forking ranks from it is safe, and it ends with the process that started it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def launch(fn: Callable[..., Any], nproc: int, run_id: str, *args: Any,
           preload: tuple[str, ...] = (), cpu: bool = True) -> dict[int, Any]:
    """``fn(*args)`` on ``nproc`` local ranks of one process group: {rank: what it returned}.
    ``preload``: more modules every rank imports, imported once in the server instead.
    ``cpu``: the ranks train on CPU devices (GPU ranks take multiprocessing's server, as a
    run's do)."""
    import multiprocessing

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gputui.train.agent import RANK_PRELOAD, _fork_own_server, free_port

    extra = ["strategy_harness", "rounding", *preload]
    # "__main__": the script whose rank function this is (fn pickles by its name in it)
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        [*RANK_PRELOAD, *extra, "__main__"])
    for name in extra:  # what a forked server inherits (the script is imported already)
        importlib.import_module(name)
    if cpu:
        _fork_own_server()  # None: multiprocessing spawns its server at the launch
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                          run_id=run_id, rdzv_configs={"is_host": True}, max_restarts=0,
                          start_method="forkserver", monitor_interval=0.1)
    return elastic_launch(config, fn)(*args)
