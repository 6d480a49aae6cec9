"""Every strategy on a tiny model, for the checkpoint-compatibility test, and the script that
wrote the checkpoints in tests/unit/data/checkpoints_v1/ with gputui's code as it was before
the narrow Strategy interface (main at ae0fb1f):

    git archive ae0fb1f gputui | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old .venv/bin/python tests/unit/old_checkpoints.py tests/unit/data/checkpoints_v1

Each strategy trains STEPS steps on fixed random batches and saves its checkpoint as a run
does. ddp and fsdp run as a world of one process (a gloo group of this process alone).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import user_model  # noqa: E402 - beside this file
from strategy_harness import make_config  # noqa: E402

CASES = {"single": "cpu", "dp": "cpu*2", "scratch": "cpu*2", "model_parallel": "cpu*2",
         "ddp": "cpu", "fsdp": "cpu"}
SIZE, BATCH, STEPS = 8, 16, 2  # 8x8 images: a model of about a thousand parameters
FIXTURES = HERE / "data" / "checkpoints_v1"


def build(name: str, cls=None):
    """The strategy ``name`` (or its subclass ``cls``) set up on CASES[name] with the user
    model (user_model.NET)."""
    from gputui.train import strategies
    from gputui.hw.discovery import resolve_devices

    spec = CASES[name]
    extra = {"strategy.fsdp_wrap": ["Block"]} if name == "fsdp" else {}  # not a Sequential
    cfg = make_config(name, spec, "lenet", BATCH, **{"model.factory": user_model.NET}, **extra)
    strategy = (cls or strategies.load(name))(cfg, resolve_devices(spec), 1, SIZE, 10)
    strategy.setup()
    return strategy


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, 1, SIZE, SIZE, generator=g),
             torch.randint(0, 10, (BATCH,), generator=g)) for _ in range(STEPS)]


@contextlib.contextmanager
def world_of_one():
    """A gloo process group of this process alone (ddp and fsdp set up inside it)."""
    import torch.distributed as dist

    from gputui.train.strategies.rank import destroy_group

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}",
                                rank=0, world_size=1)
        try:
            yield
        finally:
            destroy_group()


def write(out: Path) -> None:
    from gputui.train import checkpoint as ckpt

    out.mkdir(parents=True, exist_ok=True)
    with world_of_one():
        for name in CASES:
            strategy = build(name)
            for x, y in batches():
                strategy.train_step(x, y)
            ckpt.save(out / f"{name}.pt", strategy, ckpt.Position(1, STEPS, STEPS, 1.0))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
