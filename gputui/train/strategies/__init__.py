"""Training strategies: one module each behind ``base.Strategy``, each holding its class as
``STRATEGY``; what each is (name, description, device counts) lives torch-free in
``gputui.core.registry``, and :func:`load` imports the one a run names (this imports torch)."""

import importlib

from gputui.core import registry

__all__ = ["load", "registry"]


def load(name: str) -> type:
    """The implementation class of the registered strategy ``name`` (imports only its module:
    a run loads the one it runs, not every strategy's imports)."""
    info = registry.get(name)
    if info is None:
        raise KeyError(f"no strategy named {name!r}")
    return importlib.import_module(f"{__name__}.{info.module}").STRATEGY
