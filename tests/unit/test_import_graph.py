"""The package's import graph points one way and has no cycle; the lower layers stay free of
torch, Textual and NVML.

The layers, lowest first (docs/development.md, "How it fits together"): ``core`` (leaves), ``plan`` and
``hw`` (each on core only), ``train`` (the child side: core, plan and hw), ``runs`` (the parent
side: core, plan and hw, never train), then ``tui`` (on runs) and ``cli`` (on tui and runs). A
module may import its own layer and the layers listed for it in ``MAY_IMPORT``; the parent
names a child-side module only where it spawns a process on it (``ENTRY_POINTS``).

Every ``import`` of a gputui module counts, at module level or inside a function (a lazy import
is still a dependency; only ``if TYPE_CHECKING:`` blocks, which never run, are left out), and so
does ``importlib.import_module("gputui...")`` (a string import is an import too).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gputui"

# layer -> the other layers its modules may import ("root" is gputui/__init__.py: the version).
# train reads hw because the child itself numbers the GPUs as discovery does (cuda_order), finds
# its node's address for a multi-node rendezvous (netaddr) and notes the machine's load beside
# its peak FLOPS (contention); hw is torch-free and sits on core only.
MAY_IMPORT = {
    "root": set(),
    "core": {"root"},
    "plan": {"root", "core"},
    "hw": {"root", "core"},
    "train": {"root", "core", "plan", "hw"},
    "runs": {"root", "core", "plan", "hw"},
    "tui": {"root", "core", "plan", "hw", "runs"},
    "cli": {"root", "core", "plan", "hw", "runs", "tui"},
}

# The one way the parent side reaches the child side: a process must be started on a function,
# so the module that spawns it names the child's entry point, imported inside a function (the
# spawn target, or the function that starts it) so that the parent never imports torch.
# parent module -> the child-side modules it spawns processes on.
ENTRY_POINTS = {
    "gputui.runs.warm": {"gputui.train.host"},  # the run host: every run's one process
    "gputui.runs.model_check": {"gputui.train.cutcheck"},  # the check before a model is cut
    "gputui.runs.comm_bench": {"gputui.train.comm_ranks"},  # bench-comm and predict-comm
    "gputui.runs.forecast.tracing": {"gputui.train.plan_trace"},  # the plan's tracer
    "gputui.runs.forecast.measure": {"gputui.train.plan_trace"},  # the plan's measured ranks
}

# Besides every module of core, plan and hw: the modules the command line imports before it
# knows which command runs. None may bring torch, torchvision or Textual with it.
TORCH_FREE_TOO = ["gputui.cli", "gputui.cli.common", "gputui.cli.run", "gputui.cli.output",
                  "gputui.runs.launcher", "gputui.runs.prepare"]
# Modules that ask neither the hardware nor the strategies' code, not even lazily: what they
# reach, through any gputui import, must not be NVML, discovery, torch or pynvml.
HARDWARE_FREE = ["gputui.core.config", "gputui.plan", "gputui.core.devices"]
HARDWARE = ("gputui.hw",)


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


def import_graph(modules: dict[str, Path], typing_too: bool = False) -> dict[str, set[str]]:
    """module -> the gputui modules it imports (resolved to the modules that exist);
    ``typing_too``: the imports under ``if TYPE_CHECKING:`` count as well."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = set() if typing_too else _type_checking_only(tree)
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
            elif isinstance(node, ast.Call) and string_import(node, name) is not None:
                targets = [string_import(node, name) or ""]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith("gputui") else None
                if found and found != name:
                    graph[name].add(found)
    return graph


@functools.cache
def package_graph(typing_too: bool = False) -> dict[str, set[str]]:
    """gputui's own import graph, built once per test session (parsing every module takes
    seconds on a loaded machine)."""
    return import_graph(_modules(), typing_too)


def string_import(call: ast.Call, module: str) -> str | None:
    """The module (or the package, where the rest of the name is computed) that
    ``importlib.import_module(...)`` or ``__import__(...)`` names: a literal name, or the
    literal start of an f-string (``f"{__name__}.{x}"`` starts with ``module``); None for any
    other call."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if called not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        first = arg.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip(".")
        if (isinstance(first, ast.FormattedValue) and isinstance(first.value, ast.Name)
                and first.value.id == "__name__"):
            return module
    return ""  # a name known only when it runs: no gputui module can be told


def test_a_string_import_is_an_import(tmp_path):
    (tmp_path / "a.py").write_text("import importlib\n"
                                   "def load(x):\n"
                                   "    importlib.import_module('gputui.train.loop')\n"
                                   "    importlib.import_module(f'gputui.train.strategies.{x}')\n")
    modules = {"gputui.core.a": tmp_path / "a.py", "gputui.train.loop": tmp_path / "a.py",
               "gputui.train.strategies": tmp_path / "a.py"}
    graph = import_graph(modules)
    assert graph["gputui.core.a"] == {"gputui.train.loop", "gputui.train.strategies"}
    assert upward({"gputui.core.a": graph["gputui.core.a"]}) == [
        "gputui.core.a -> gputui.train.loop (core may import only its own layer)",
        "gputui.core.a -> gputui.train.strategies (core may import only its own layer)"]


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
    """Not even one that only type annotations make: two modules that need each other's
    names are one idea split in two (merge them) or share a piece that belongs lower down."""
    found = cycles(package_graph(typing_too=True))
    assert not found, ("import cycle(s), `if TYPE_CHECKING:` imports included: "
                       + "; ".join(" <-> ".join(sorted(c)) for c in found)
                       + ". Merge the halves, or move the shared piece down into a module "
                         "both can import.")


def test_a_type_checking_import_closes_a_cycle(tmp_path):
    (tmp_path / "a.py").write_text("from gputui_fake import b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from gputui_fake.a import A\n")
    modules = {"gputui_fake.a": tmp_path / "a.py", "gputui_fake.b": tmp_path / "b.py"}
    assert cycles(import_graph(modules)) == set()
    assert cycles(import_graph(modules, typing_too=True)) == {frozenset(modules)}


def layer(module: str) -> str:
    """The layer a module belongs to: the folder under gputui/ (``plan`` for plan.py)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if parts[1] == "__main__":
        return "cli"
    return parts[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points the wrong way, as 'importer -> imported (why)'."""
    bad = []
    for name, targets in sorted(graph.items()):
        mine = layer(name)
        allowed = MAY_IMPORT.get(mine)
        for target in sorted(targets):
            theirs = layer(target)
            if allowed is None:
                bad.append(f"{name}: not in a known layer ({', '.join(MAY_IMPORT)})")
                break
            if target in ENTRY_POINTS.get(name, ()) or (
                    target == "gputui.train" and name in ENTRY_POINTS):
                continue  # the spawn target it names (``from gputui.train import x``)
            if theirs != mine and theirs not in allowed:
                bad.append(f"{name} -> {target} ({mine} may import only "
                           f"{', '.join(sorted(allowed - {'root'})) or 'its own layer'})")
    return bad


def test_the_layer_check_finds_an_upward_import():
    graph = {"gputui.core.config": {"gputui.core.events", "gputui"},
             "gputui.plan": {"gputui.core.config"},
             "gputui.runs.warm": {"gputui.plan", "gputui.train", "gputui.train.host"}}
    assert upward(graph) == []
    graph["gputui.core.config"].add("gputui.hw.discovery")
    graph["gputui.plan"].add("gputui.hw.nvml")
    graph["gputui.train.loop"] = {"gputui.runs.launcher"}
    graph["gputui.runs.sweep.runner"] = {"gputui.train.loop"}  # not a process it spawns
    graph["gputui.runs.warm"].add("gputui.train.loop")  # nor this one
    assert upward(graph) == [
        "gputui.core.config -> gputui.hw.discovery (core may import only its own layer)",
        "gputui.plan -> gputui.hw.nvml (plan may import only core)",
        "gputui.runs.sweep.runner -> gputui.train.loop (runs may import only core, hw, plan)",
        "gputui.runs.warm -> gputui.train.loop (runs may import only core, hw, plan)",
        "gputui.train.loop -> gputui.runs.launcher (train may import only core, hw, plan)"]


def test_imports_point_one_way():
    bad = upward(package_graph())
    assert not bad, ("imports against the layers:\n  " + "\n  ".join(bad)
                     + "\nMove the shared piece down, or the importer up.")


def torch_free() -> list[str]:
    """core, plan and hw; runs too (the parent side names a child's entry point only inside a
    function, so that a spawn never brings torch into the parent); and the CLI's first modules."""
    low = [m for m in _modules() if layer(m) in ("core", "plan", "hw", "runs")]
    return sorted(low) + [m for m in TORCH_FREE_TOO if layer(m) != "runs"]


def first_import_pulling_in(names: list[str], forbidden: tuple[str, ...]) -> str:
    """Imports ``names`` one after another in a fresh interpreter; '' when none brings any
    ``forbidden`` module into sys.modules, else which one brought which."""
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            f"    heavy = [m for m in {forbidden!r} if m in sys.modules]\n"
            "    if heavy:\n"
            "        sys.exit(f'{name} pulls in {heavy}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    return out.stderr.strip() or ("" if out.returncode == 0 else f"exit {out.returncode}")


def test_the_fresh_import_check_sees_a_heavy_import():
    assert "pulls in ['torch']" in first_import_pulling_in(["gputui.train.loop"], ("torch",))


def test_torch_free_modules_import_no_torch():
    names = torch_free()
    assert "gputui.core.config" in names and "gputui.hw.nvml" in names
    assert first_import_pulling_in(names, ("torch", "torchvision", "textual")) == ""


def test_core_and_plan_import_no_nvml():
    names = [m for m in _modules() if layer(m) in ("core", "plan")]
    assert first_import_pulling_in(names, ("pynvml", "gputui.hw")) == ""


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
    graph = {"gputui.core.config": {"gputui.x"}, "gputui.x": {"gputui.hw.nvml"},
             "gputui.hw.nvml": set()}
    assert "gputui.hw.nvml" in reachable(graph, "gputui.core.config")


def test_config_and_plan_reach_no_hardware_and_no_torch():
    modules = _modules()
    graph = package_graph()
    for name in HARDWARE_FREE:
        reached = reachable(graph, name)
        bad = sorted(m for m in reached if m.startswith(HARDWARE))
        assert not bad, f"{name} reaches {bad}; hand it the devices discovery found instead"
        heavy = {m: sorted(external_imports(modules[m]) & {"torch", "pynvml", "textual"})
                 for m in {name, *reached}}
        assert not any(heavy.values()), f"{name} reaches {heavy}"


def test_the_app_starts_without_torch_or_the_command_families():
    """`gputui` with no command reads its two flags without building the whole parser (whose
    command families' imports delayed the first paint), and what the app imports to start
    brings no torch: training runs in other processes."""
    code = ("import sys\n"
            "from gputui.cli import app_args\n"
            "assert app_args(['run', 'quickstart']) is None and app_args(['--help']) is None\n"
            "args = app_args(['--preset', 'quickstart', '--runs-dir', 'r'])\n"
            "assert (args.func.__name__, args.preset, args.global_runs_dir) == "
            "('cmd_tui', 'quickstart', 'r'), args\n"
            "import gputui.tui.app\n"
            "extra = sorted(m for m in sys.modules if m.startswith('gputui.cli.')\n"
            "               and m not in ('gputui.cli.common', 'gputui.cli.run'))\n"
            "heavy = [m for m in ('torch', 'torchvision', 'numpy') if m in sys.modules]\n"
            "sys.exit(f'families {extra}, heavy {heavy}' if extra or heavy else 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr.strip()
