"""The package's import graph has no cycle, and the torch-free modules stay torch-free.

Every ``import`` of a gputui module counts, at module level or inside a function (a lazy import
is still a dependency; only ``if TYPE_CHECKING:`` blocks, which never run, are left out).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gputui"

# Modules that the CLI, the app and config checks import: no torch, directly or through
# another gputui module they import at module level.
TORCH_FREE = ["gputui.config", "gputui.config_schema", "gputui.events", "gputui.devices",
              "gputui.gpus", "gputui.presets", "gputui.cli_common", "gputui.filewrite",
              "gputui.proctree", "gputui.breakdown", "gputui.training.runstore", "gputui.cli",
              "gputui.cli_run", "gputui.cli_output", "gputui.plan", "gputui.discovery",
              "gputui.prepare"]
# Modules that ask neither the hardware nor the strategies' code, not even lazily: what they
# reach, through any gputui import, must not be NVML, discovery, torch or pynvml.
HARDWARE_FREE = ["gputui.config", "gputui.plan", "gputui.devices"]
HARDWARE = ("gputui.telemetry", "gputui.discovery", "gputui.prepare")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the gputui modules it imports (resolved to the modules that exist)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith("gputui") else None
                if found and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == {frozenset("abc")}
    graph["c"] = set()
    assert cycles(graph) == set()


def test_no_import_cycle():
    found = cycles(import_graph(_modules()))
    assert not found, ("import cycle(s): " + "; ".join(" <-> ".join(sorted(c)) for c in found)
                       + ". Move the shared piece down into a module both can import.")


def test_torch_free_modules_import_no_torch():
    code = ("import importlib, sys\n"
            f"for name in {TORCH_FREE!r}:\n"
            "    importlib.import_module(name)\n"
            "    heavy = [m for m in ('torch', 'torchvision', 'textual') if m in sys.modules]\n"
            "    if heavy:\n"
            "        sys.exit(f'{name} pulls in {heavy}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr.strip()


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (lazy imports included)."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def external_imports(path: Path) -> set[str]:
    """The top-level names of the non-gputui packages a module imports (lazily or not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_reaching_hardware_is_caught():
    graph = {"gputui.config": {"gputui.x"}, "gputui.x": {"gputui.telemetry.nvml"},
             "gputui.telemetry.nvml": set()}
    assert "gputui.telemetry.nvml" in reachable(graph, "gputui.config")


def test_config_and_plan_reach_no_hardware_and_no_torch():
    modules = _modules()
    graph = import_graph(modules)
    for name in HARDWARE_FREE:
        reached = reachable(graph, name)
        bad = sorted(m for m in reached if m.startswith(HARDWARE))
        assert not bad, f"{name} reaches {bad}; hand it the devices discovery found instead"
        heavy = {m: sorted(external_imports(modules[m]) & {"torch", "pynvml", "textual"})
                 for m in {name, *reached}}
        assert not any(heavy.values()), f"{name} reaches {heavy}"
    # config is loading, coercion and overrides: the rules (plan, the strategies) sit above it
    above = sorted(m for m in reachable(graph, "gputui.config")
                   if m.startswith(("gputui.training", "gputui.plan")))
    assert not above, f"gputui.config reaches {above}"
