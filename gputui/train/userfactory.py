"""Import and call the factories a preset names (``model.factory``, ``data.factory``).

This runs in the training process only (the CLI and the app never import the user's code).
Every failure becomes a :class:`UserCodeError` whose message is one line naming the config key,
the factory and the cause, e.g. ``model.factory 'nets.py:build' failed: ValueError: bad width``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

from gputui.core.errors import UserError, fault_line
from gputui.core.usercode import parse


class UserCodeError(UserError, RuntimeError):
    """A factory that cannot be imported, fails, or returns the wrong thing (one line)."""


def cause(exc: BaseException) -> str:
    """``Type: first line`` of an exception (the user's code may raise our own errors too:
    their type still says where it came from)."""
    return fault_line(exc)


def import_function(key: str, spec: str) -> Callable:
    """The function a ``module:function`` or ``file.py:function`` spec names, imported."""
    f = parse(spec)
    try:
        if f.kind == "file":
            path = Path(f.target).expanduser().resolve()
            name = f"gputui_user_{path.stem}_{abs(hash(str(path))) % 10**8}"
            module = sys.modules.get(name)
            if module is None:
                mspec = importlib.util.spec_from_file_location(name, path)
                if mspec is None or mspec.loader is None:
                    raise ImportError(f"cannot load {path} as Python")
                module = importlib.util.module_from_spec(mspec)
                sys.modules[name] = module  # dataclasses and pickling look modules up here
                try:
                    mspec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            if os.getcwd() not in sys.path:  # modules are found from the folder gputui runs in
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(f.target)
    except Exception as exc:  # noqa: BLE001 - any import failure is one line for the user
        raise UserCodeError(f"{key} '{spec}' cannot be imported: {cause(exc)}") from exc
    if not hasattr(module, f.function):
        raise UserCodeError(f"{key} '{spec}': {f.target} has no '{f.function}'; name a "
                            f"function it defines")
    fn = getattr(module, f.function)
    if not callable(fn):
        raise UserCodeError(f"{key} '{spec}': '{f.function}' is a {type(fn).__name__}, not a "
                            f"function")
    return fn


def call(key: str, spec: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call a user factory; any exception becomes one line naming it."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        raise UserCodeError(f"{key} '{spec}' failed: {cause(exc)}") from exc


def build_model(model: Any, channels: int, height: int, width: int, classes: int, seed: int):
    """The model ``model.factory`` names, built on the CPU under ``seed`` (the same seed gives
    the same parameters in every process, so every strategy starts from single's init)."""
    import torch
    from torch import nn

    spec = model.factory
    f = parse(spec)
    if f.kind == "imagefolder":
        raise UserCodeError(f"model.factory '{spec}': imagefolder: names data; use it as "
                            f"data.factory")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if f.kind == "torchvision":
            built = torchvision_model(f.target, channels, classes, dict(model.kwargs))
        else:
            fn = import_function("model.factory", spec)
            built = call("model.factory", spec, fn, channels, height, width, classes,
                         **dict(model.kwargs))
    if not isinstance(built, nn.Module):
        raise UserCodeError(f"model.factory '{spec}' returned a {type(built).__name__}, not an "
                            f"nn.Module; return the model")
    if not any(True for _ in built.parameters()):
        raise UserCodeError(f"model.factory '{spec}' returned a model without parameters; "
                            f"there is nothing to train")
    return built


def torchvision_model(name: str, channels: int, classes: int, kwargs: dict):
    """``torchvision.models.get_model(name)`` with ``classes`` outputs and its first
    convolution adapted to ``channels`` (torchvision's models expect 3)."""
    spec = f"torchvision:{name}"
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA torchvision beside a CPU-only torch
        raise UserCodeError(f"model.factory '{spec}': torchvision cannot be imported here "
                            f"({cause(exc)}); install the torchvision built for this torch, "
                            f"or name your own factory") from None
    models = torchvision.models
    if name not in models.list_models():
        raise UserCodeError(f"model.factory '{spec}': torchvision has no model '{name}'; see "
                            f"torchvision.models.list_models()")
    model = call("model.factory", spec, models.get_model, name, weights=None,
                 num_classes=classes, **kwargs)
    return adapt_input_channels(model, channels)


def adapt_input_channels(model, channels: int):
    """Replace the first Conv2d when it expects another channel count (same shape otherwise,
    fresh weights): a torchvision model built for RGB then reads grey images, and back."""
    from torch import nn

    first = next(((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if first is None or first[1].in_channels == channels:
        return model  # no convolution (the model decides what it reads), or it already fits
    name, conv = first
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    # a Conv2d's sizes are pairs, but its base class (_ConvNd) declares them tuple[int, ...]
    setattr(parent, attr, nn.Conv2d(channels, conv.out_channels,
                                    conv.kernel_size, conv.stride,  # type: ignore[arg-type]
                                    conv.padding, conv.dilation,  # type: ignore[arg-type]
                                    conv.groups, conv.bias is not None, conv.padding_mode))
    return model
