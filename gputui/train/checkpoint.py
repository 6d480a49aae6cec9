"""Checkpoints: everything needed to continue a run exactly where it stopped.

One file per run, ``<run folder>/checkpoint.pt``, replaced atomically (written to a temporary
file, fsynced, renamed: ``filewrite.write_with``), so a kill or a full disk at any moment leaves
either the previous checkpoint or the new one, never half of one, and no temporary file. It
holds the strategy's state (models, optimizers, grad scaler), the lr schedule's position (the
optimizer steps taken; a checkpoint written before schedules existed resumes from its global
step, the same count), the data position (epoch, step, global step, the epoch's loss so far)
and the random states (torch, CUDA, Python, NumPy when loaded). Only tensors and plain
containers are stored, so it loads with ``torch.load(..., weights_only=True)``: a checkpoint
cannot run code.
"""

from __future__ import annotations

import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gputui.core.errors import UserError, brief, first_line
from gputui.core.filewrite import write_with
from gputui.core.runstore import CHECKPOINT_NAME
from gputui.train.strategies.base import Strategy

FORMAT = 1


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, unreadable or does not fit the run; one line for the user."""


@dataclass(frozen=True)
class Position:
    """Where training stands: ``step`` steps of ``epoch`` are done (``epoch_done`` once the
    epoch's evaluation ran too); ``epoch_loss`` is the summed loss of those steps."""

    epoch: int = 1
    step: int = 0
    global_step: int = 0
    epoch_loss: float = 0.0
    epoch_done: bool = False

    def next_start(self) -> tuple[int, int, float]:
        """(epoch to run, steps of it to skip, loss carried into it)."""
        if self.epoch_done:
            return self.epoch + 1, 0, 0.0
        return self.epoch, self.step, self.epoch_loss


def checkpoint_path(where: str | Path) -> Path:
    """A run folder's checkpoint file, or ``where`` itself when it names a file."""
    p = Path(where)
    return p / CHECKPOINT_NAME if p.is_dir() else p


def unsupported(strategy: Strategy) -> str | None:
    """Why this strategy cannot be checkpointed, or None. Sharded parameters (DTensors, as
    FSDP2 makes) need the strategy's own state_dict hooks: the default ones would save one
    rank's shards only."""
    if type(strategy).state_dict is not Strategy.state_dict:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed tensors cannot have made one
        return None
    for model in strategy.models():
        if any(isinstance(p, DTensor) for p in model.parameters()):
            return (f"strategy '{strategy.name}' shards its parameters and has no checkpoint "
                    f"hooks yet, so it cannot be checkpointed or resumed")
    return None


def rng_state() -> dict[str, Any]:
    """The random states training may draw from, as tensors and plain values."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos),
                          int(has_gauss), float(cached))
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved (states of devices that are not here are skipped)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    saved_np = state.get("numpy")
    if saved_np is not None:
        import numpy as np

        name, keys, pos, has_gauss, cached = saved_np
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def save(path: str | Path, strategy: Strategy, position: Position,
         write: bool = True) -> None:
    """Write the checkpoint atomically. ``strategy.state_dict()`` is called on every rank
    (sharded strategies gather there); only a caller with ``write`` touches the file."""
    state = {"format": FORMAT, "strategy": strategy.name, "world_size": strategy.world_size,
             "position": asdict(position), "state": strategy.state_dict(),
             "schedule": strategy.updater.state_dict(), "rng": rng_state()}
    if not write:
        return
    # a full disk: the temporary file goes, the previous checkpoint stays, WriteFailed says so
    write_with(path, lambda fh: torch.save(state, fh))


def load(where: str | Path) -> dict[str, Any]:
    """Read a checkpoint (a file, or a run folder holding one) with weights_only=True."""
    path = checkpoint_path(where)
    if not path.exists():
        raise CheckpointError(f"{path}: no checkpoint there (the run stopped before its first "
                              f"epoch ended, or run.checkpoint was off)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torn, foreign or code-carrying files alike
        first = first_line(exc) or type(exc).__name__
        raise CheckpointError(f"{path}: not a readable gputui checkpoint ({brief(first)})") \
            from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a gputui checkpoint of format {FORMAT}")
    return data


def restore(strategy: Strategy, data: dict[str, Any]) -> Position:
    """Load a checkpoint's state into a set-up strategy; returns the saved position."""
    if data["strategy"] != strategy.name or data["world_size"] != strategy.world_size:
        raise CheckpointError(f"the checkpoint was written by strategy '{data['strategy']}' with "
                              f"{data['world_size']} process(es), this run is '{strategy.name}' "
                              f"with {strategy.world_size}; resume with the saved config")
    try:
        strategy.load_state_dict(data["state"])
    except (RuntimeError, ValueError, KeyError) as exc:
        first = first_line(exc) or type(exc).__name__
        raise CheckpointError(f"the checkpoint does not fit this model ({brief(first)})") \
            from None
    set_rng_state(data["rng"])
    position = Position(**data["position"])
    strategy.updater.steps = data.get("schedule", {}).get("steps", position.global_step)
    return position
