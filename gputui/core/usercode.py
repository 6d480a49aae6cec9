"""Code a preset names: ``model.factory`` and ``data.factory``, checked without running it.

A factory is written ``package.module:function`` (found from the current folder, then the
Python path), ``path/to/file.py:function`` (relative to the current folder), or one of the
named sources ``torchvision:NAME`` (a torchvision model) and ``imagefolder:PATH`` (a folder in
torchvision's ImageFolder layout). The TOML stays data: this module only reads the spec, finds
the file and parses it (``ast``), so the CLI and the app can refuse a typo and show that a
preset runs code before anything is imported. Importing and calling happen in the training
process (:mod:`gputui.train.userfactory`). Torch-free.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

CODE_KEYS = ("model.factory", "data.factory")
NAMED_SOURCES = ("torchvision", "imagefolder")


@dataclass(frozen=True)
class FactorySpec:
    """A parsed factory: ``kind`` is module, file, torchvision or imagefolder."""

    kind: str
    target: str  # the module name, the file path, the torchvision name or the folder
    function: str = ""

    @property
    def runs_user_code(self) -> bool:
        """True for the user's own module or file (torchvision and folders are not theirs)."""
        return self.kind in ("module", "file")


def parse(spec: str) -> FactorySpec:
    """Split a factory spec; raises ValueError with the fix when it is malformed."""
    head, sep, tail = spec.strip().rpartition(":")
    if not sep or not head or not tail:
        raise ValueError("write it as 'package.module:function' or 'path/to/file.py:function'")
    if head == "torchvision":
        return FactorySpec("torchvision", tail)
    if head == "imagefolder":
        return FactorySpec("imagefolder", tail)
    if head.startswith("imagefolder:"):  # a Windows-style path after the prefix
        return FactorySpec("imagefolder", spec.strip().split(":", 1)[1])
    if not tail.isidentifier():
        raise ValueError(f"'{tail}' is not a function name; write 'module:function'")
    if head.endswith(".py") or "/" in head or os.sep in head:
        return FactorySpec("file", head, tail)
    if not all(part.isidentifier() for part in head.split(".")):
        raise ValueError(f"'{head}' is not a module name (or a .py file); write "
                         f"'package.module:function' or 'path/to/file.py:function'")
    return FactorySpec("module", head, tail)


def spec_problem(spec: str) -> str | None:
    """None when ``spec`` is well formed, else the fix (format only: no file is read)."""
    try:
        parse(spec)
    except ValueError as exc:
        return str(exc)
    return None


def search_path() -> list[str]:
    """Where module factories are looked for: the current folder first, then sys.path."""
    return [os.getcwd(), *[p for p in sys.path if p]]


def find_problem(spec: str, key: str = "factory") -> str | None:
    """None when the factory's file and function can be found, else one line with the fix.
    Reads and parses files; imports and runs nothing."""
    try:
        f = parse(spec)
    except ValueError as exc:
        return f"{key} = {spec!r}: {exc}"
    if f.kind == "torchvision":
        if PathFinder.find_spec("torchvision", search_path()) is None:
            return (f"{key} = {spec!r}: torchvision is not installed; install the torchvision "
                    f"built for your torch, or name your own factory")
        return None
    if f.kind == "imagefolder":
        root = Path(f.target).expanduser()
        missing = [s for s in ("train", "test") if not (root / s).is_dir()]
        if missing:
            return (f"{key} = {spec!r}: no {' or '.join(m + '/' for m in missing)} folder in "
                    f"{root}; give a folder holding train/<class>/... and test/<class>/...")
        return None
    if f.kind == "file":
        path = Path(f.target).expanduser()
        if not path.is_file():
            return (f"{key} = {spec!r}: no file {path} (paths are relative to the folder "
                    f"gputui runs in, {os.getcwd()})")
        source: Path | None = path
    else:
        source, why = _module_source(f.target)
        if why:
            return f"{key} = {spec!r}: {why}"
    if source is not None and source.suffix == ".py":
        names = _top_level_names(source)
        if names is None:
            return f"{key} = {spec!r}: {source} is not valid Python; fix its syntax"
        if names and f.function not in names:
            return (f"{key} = {spec!r}: {source} defines no '{f.function}'; "
                    f"name a function it defines")
    return None


def _module_source(name: str) -> tuple[Path | None, str | None]:
    """The source file of module ``name`` found without importing anything (no package
    __init__ runs), or the reason it cannot be found."""
    parts = name.split(".")
    if parts[0] in sys.builtin_module_names:
        return None, None
    locations = search_path()
    spec = None
    for i, part in enumerate(parts):
        spec = PathFinder.find_spec(part, locations)
        if spec is None:
            where = "the current folder or the Python path" if i == 0 else ".".join(parts[:i])
            return None, f"no module named '{'.'.join(parts[:i + 1])}' in {where}"
        locations = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not locations:
            return None, None  # a module that sets attributes as it imports (os.path): no guess
    origin = spec.origin if spec is not None else None
    return (Path(origin) if origin and origin not in ("built-in", "frozen") else None), None


def _top_level_names(path: Path) -> set[str] | None:
    """Names a module binds at top level (defs, classes, assignments, imports); an empty set
    when it may bind names dynamically (star imports, module __getattr__); None on a syntax
    error."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None
    except OSError:
        return set()
    names: set[str] = set()
    if not _collect(tree.body, names):
        return set()
    return set() if "__getattr__" in names else names


def _collect(body: list, names: set[str]) -> bool:
    """Add the names ``body`` binds (also inside if/try/with/for blocks, which may bind
    them); False when it may bind names that cannot be seen (a star import)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return False
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                # an except handler's own body is found through its "body" in turn
                if isinstance(inner, list) and not _collect(inner, names):
                    return False
    return True


def code_named(config: Any) -> list[str]:
    """``key = spec`` for each factory a config (a RunConfig or its dict) names; [] when it
    names none. What the CLI and the app show before a run."""
    out = []
    for key in CODE_KEYS:
        table, name = key.split(".")
        section = config.get(table, {}) if isinstance(config, dict) else getattr(config, table)
        value = section.get(name, "") if isinstance(section, dict) else getattr(section, name)
        if value:
            out.append(f"{key} = {value}")
    return out


def code_line(config: Any) -> str:
    """One line saying what code a config runs, or '' when it runs none."""
    named = code_named(config)
    return f"runs your code: {'; '.join(named)}" if named else ""


