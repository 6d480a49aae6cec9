"""The config the app opens on, and the material's settings one choice away.

The app's first run must show a model learning within its first minute, so the app opens on
the quickstart preset's learning settings (PyTorch's init and SGD with momentum 0.9: about
95 % test accuracy on the embedded synthetic task in its 3 epochs) on one CPU device. The
material's own settings (its N(0, 0.01) init, plain SGD) are offered beside it, with the
reason they learn slowly there (:data:`SLOW_NOTE`). Pure Python: no Textual, no torch.
"""

from __future__ import annotations

from typing import Any

from gputui.core.config import RunConfig, from_dict

SOURCE = "the app's default"
# quickstart.toml's learning settings (tests/tui/test_defaults.py keeps the two equal)
APP_DEFAULT: dict[str, Any] = {
    "run": {"name": "first-run", "epochs": 3, "seed": 0, "log_every": 10},
    "model": {"name": "lenet", "init": "default"},
    "data": {"name": "synthetic", "train_size": 12000, "test_size": 2000},
    "optim": {"batch_size": 256, "lr": 0.1, "momentum": 0.9},
    "devices": {"spec": "cpu"},
    "strategy": {"name": "single"},
}
# the material's: N(0, 0.01) init, lr 0.1, no momentum (RunConfig's own defaults)
MATERIAL: dict[str, Any] = {
    **APP_DEFAULT,
    "run": {**APP_DEFAULT["run"], "name": "material"},
    "model": {"name": "lenet", "init": "normal", "init_std": 0.01},
    "optim": {"batch_size": 256, "lr": 0.1, "momentum": 0.0},
}
BUILTINS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("app default (learns)", APP_DEFAULT),
    "material": ("the material (slow here)", MATERIAL),
}
SLOW_NOTE = ("The material's N(0, 0.01) init with plain SGD sits at chance (10 %) for a few "
             "hundred steps, and the synthetic task has under 50 an epoch: expect a flat line "
             "for several epochs. Its own data (Fashion-MNIST, 235 steps an epoch) or "
             "model.init = default with momentum 0.9 (the app default) learn at once.")


def app_default() -> RunConfig:
    """The config the app opens on when no preset is given."""
    return from_dict(APP_DEFAULT, SOURCE)


def builtin(name: str) -> RunConfig:
    """A built-in choice of the preset list: 'default' or 'material'."""
    return from_dict(BUILTINS[name][1], f"the app's {name} settings")


def learns_slowly(cfg: RunConfig) -> bool:
    """The material's init and plain SGD on the small synthetic task: a flat start."""
    return (cfg.model.init == "normal" and not cfg.model.factory and cfg.model.name == "lenet"
            and cfg.data.name == "synthetic" and cfg.optim.name == "sgd"
            and cfg.optim.momentum == 0.0)
