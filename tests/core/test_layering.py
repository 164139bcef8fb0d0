"""Imports run one way: the package's module graph, read from the source with ``ast``.

The graph has one node per module (a package is its ``__init__``) and an edge for every import
of a package module, wherever it is written: at module level, inside a function or method (it
still runs, only later: the dependency is the same), under ``try`` or ``if``. ``from a import b``
is an edge to ``a.b`` when that is a module, else to ``a``. The implicit import of a module's
parent packages is not an edge (every module would depend on the package facade).

Imports under ``if TYPE_CHECKING:`` never run, so they cannot close an import-time cycle; they
are kept apart, as *typing-only* edges, and each check says which kind an offending edge is.
They still count: an annotation naming a module above is code written against it, so the cycle
checks run on the runtime graph and then again with the typing-only edges added, and the
layering holds for every edge. Where a lower module needs something of a higher one, it names
it by a small Protocol of its own (policies/service.py, integrity/engine.py, batching.py,
store/growth.py, store/inserts.py, store/replica_ids.py) or is handed a callback (the first
put's helper body, compile_helper.py; the serving-path warm-up, warm_up_hook.py).

The checks: no cycle through the service (``master``); none among the modules of ``store/``;
each module imports only its own layer or the layers below it (:data:`LAYERS`); and kernels
import nothing of the package outside ``kernels/`` but the constants modules (:data:`KERNEL_DEPS`).
"""
from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mooncake_columnar.testing.graphs import strongly_connected_components

PACKAGE = "mooncake_columnar"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# lowest first; a module may import modules of its own layer and of the layers before it. Names
# are module paths below the package ("" is the package's own __init__, the public facade), and
# each names that module and every module below it; a module takes the layer of its longest match.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # no engine state: errors, clocks, constants and column schemas, settings, messages, argument
    # checks, the lock, metrics, the background thread, process settings, memory and mmap helpers,
    # the hook the serving-path warm-up registers in, the report of the one-time kernel compilation
    ("foundation", ("errors", "clock", "schema", "config", "messages", "validation", "locking", "metrics",
                    "background", "runtime", "memory", "mapped", "warm_up_hook", "compile_progress")),
    ("kernels", ("kernels",)),
    ("store", ("store",)),
    # decisions over the store, the journal contract they write to, the first put's helper fork
    ("policies", ("policies", "changelog", "compile_helper")),
    ("integrity", ("integrity",)),
    ("batching", ("batching",)),
    ("service", ("master",)),
    ("snapshots", ("snapshots",)),
    ("ha", ("ha",)),
    # the warm-up runs a miniature of all the above (with tools/synthetic.py's workloads)
    ("top", ("", "warmup", "tools", "server", "testing")),
]
KERNEL_DEPS = frozenset({"errors", "clock", "schema"})  # what kernels may import from outside kernels/


@dataclass
class Graph:
    modules: set[str] = field(default_factory=set)
    # (importer, imported) -> "runtime" (module level), "function" (inside a def) or "typing"
    edges: dict[tuple[str, str], str] = field(default_factory=dict)

    def __repr__(self) -> str:  # (pytest prints the fixture of a failing test)
        return f"Graph({len(self.modules)} modules, {len(self.edges)} edges)"

    def add(self, a: str, b: str, kind: str) -> None:
        order = ("typing", "function", "runtime")  # one pair, several imports: the one that runs first
        old = self.edges.get((a, b))
        if old is None or order.index(kind) > order.index(old):
            self.edges[(a, b)] = kind

    def adjacency(self, kinds: frozenset[str]) -> dict[str, set[str]]:
        adj: dict[str, set[str]] = {m: set() for m in self.modules}
        for (a, b), kind in self.edges.items():
            if kind in kinds:
                adj[a].add(b)
        return adj


RUNTIME = frozenset({"runtime", "function"})
ALL = frozenset({"runtime", "function", "typing"})


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> list[str]:
    """The package modules ``node`` imports (resolved, relative imports included)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            full = ".".join(base + ([node.module] if node.module else []))
        else:
            full = node.module or ""
        names = [f"{full}.{a.name}" if f"{full}.{a.name}" in modules else full for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:  # ``import a.b.c`` of a name inside a module: that module
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def build_graph(sources: dict[str, tuple[str, bool]]) -> Graph:
    """The graph of ``sources``: module name -> (its source, whether it is a package's __init__)."""
    g = Graph(modules=set(sources))

    def visit(body: list[ast.stmt], module: str, package: str, typing_only: bool, in_function: bool) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                kind = "typing" if typing_only else "function" if in_function else "runtime"
                for target in _targets(node, package, g.modules):
                    if target != module:
                        g.add(module, target, kind)
                continue
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, module, package, True, in_function)
                visit(node.orelse, module, package, typing_only, in_function)
                continue
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for child_body in _bodies(node):
                visit(child_body, module, package, typing_only, inner)

    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        visit(ast.parse(source).body, module, package, False, False)
    return g


def _bodies(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested in ``node`` (if/for/while/with/try/def/class bodies, handlers)."""
    out = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            out.append(value)
    for handler in getattr(node, "handlers", []):
        out.append(handler.body)
    for case in getattr(node, "cases", []):
        out.append(case.body)
    return out


def package_sources(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    sources = {}
    for path in sorted(root.rglob("*.py")):
        name, is_package = _module_name(path, root)
        sources[name] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def strongly_connected(adj: dict[str, set[str]]) -> list[set[str]]:
    """Components of more than one module."""
    return [set(c) for c in strongly_connected_components(adj) if len(c) > 1]


def _short(module: str) -> str:
    return module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else module


def _edges_within(g: Graph, comp: set[str], kinds: frozenset[str]) -> str:
    return "\n".join(f"  {_short(a)} -> {_short(b)}  ({kind})" for (a, b), kind in sorted(g.edges.items())
                     if a in comp and b in comp and kind in kinds)


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module`` (by its longest matching name); KeyError when none."""
    name = _short(module) if module != PACKAGE else ""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (p == "" and name == "") or (p and (name == p or name.startswith(p + "."))):
                if len(p) > best_len:
                    best, best_len = i, len(p)
    if best is None:
        raise KeyError(module)
    return best


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(package_sources())


# ================================================================================ the tool itself
def test_the_graph_sees_every_kind_of_import() -> None:
    src = {
        "p": ("", True),
        "p.a": ("from typing import TYPE_CHECKING\nfrom .b import x\nfrom . import c\n"
                "if TYPE_CHECKING:\n    from .d import Y\nelse:\n    import p.e\n"
                "def f():\n    from .sub.m import z\n    try:\n        from .sub import m\n    except ImportError:\n"
                "        pass\n", False),
        "p.b": ("from .a import f\n", False), "p.c": ("", False), "p.d": ("", False), "p.e": ("", False),
        "p.sub": ("from .. import b\n", True), "p.sub.m": ("from ..a import f\n", False),
    }
    g = build_graph(src)
    assert g.edges == {("p.a", "p.b"): "runtime", ("p.a", "p.c"): "runtime", ("p.a", "p.d"): "typing",
                       ("p.a", "p.e"): "runtime", ("p.a", "p.sub.m"): "function", ("p.b", "p.a"): "runtime",
                       ("p.sub", "p.b"): "runtime", ("p.sub.m", "p.a"): "runtime"}
    assert sorted(map(sorted, strongly_connected(g.adjacency(ALL)))) == [["p.a", "p.b", "p.sub.m"]]


def test_the_graph_reads_the_package(graph: Graph) -> None:
    assert len(graph.modules) > 100
    assert graph.edges[(f"{PACKAGE}.master", f"{PACKAGE}.store.metadata")] == "runtime"
    assert f"{PACKAGE}.kernels.hashing" in graph.modules


# ================================================================================ the layering
@pytest.mark.parametrize("kinds", [RUNTIME, ALL], ids=["runtime", "with typing-only"])
def test_no_cycle_through_the_service(graph: Graph, kinds: frozenset[str]) -> None:
    service = f"{PACKAGE}.master"
    comps = [c for c in strongly_connected(graph.adjacency(kinds)) if service in c]
    assert not comps, (f"master.py is in an import cycle of {len(comps[0])} modules; its edges:\n"
                       + _edges_within(graph, comps[0], kinds))


@pytest.mark.parametrize("kinds", [RUNTIME, ALL], ids=["runtime", "with typing-only"])
def test_no_cycle_inside_the_store(graph: Graph, kinds: frozenset[str]) -> None:
    store = f"{PACKAGE}.store"
    inside = {m for m in graph.modules if m == store or m.startswith(store + ".")}
    adj = {m: targets & inside for m, targets in graph.adjacency(kinds).items() if m in inside}
    comps = strongly_connected(adj)
    assert not comps, "import cycles inside store/:\n" + "\n\n".join(_edges_within(graph, c, kinds) for c in comps)


def test_every_module_has_a_layer(graph: Graph) -> None:
    missing = []
    for m in sorted(graph.modules):
        try:
            layer_of(m)
        except KeyError:
            missing.append(_short(m))
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"


def test_imports_run_down_the_layers(graph: Graph) -> None:
    up = [f"  {_short(a)} ({LAYERS[layer_of(a)][0]}) -> {_short(b)} ({LAYERS[layer_of(b)][0]})  ({kind})"
          for (a, b), kind in sorted(graph.edges.items()) if layer_of(b) > layer_of(a)]
    assert not up, "imports of a higher layer:\n" + "\n".join(up)


def test_kernels_import_only_kernels_and_constants(graph: Graph) -> None:
    kernels = f"{PACKAGE}.kernels"
    bad = [f"  {_short(a)} -> {_short(b)}  ({kind})" for (a, b), kind in sorted(graph.edges.items())
           if (a == kernels or a.startswith(kernels + ".")) and not (b == kernels or b.startswith(kernels + "."))
           and _short(b) not in KERNEL_DEPS]
    assert not bad, f"kernels import outside kernels/ and {sorted(KERNEL_DEPS)}:\n" + "\n".join(bad)


# ================================================================================ moved names
@pytest.mark.parametrize("old, new, names", [
    ("snapshots.state", "store.snapshot_state", ("SnapshotState", "with_usage", "check_table", "empty_state")),
    ("snapshots.memory", "memory", ("prefault", "warm_free_memory", "FreeMemoryWarmer")),
    ("snapshots.mapped", "mapped", ("map_file", "release_mapped")),
    ("ha.replica_ids", "store.replica_ids", ("ReplicaIdIndex", "held_ids")),
    ("policies.eviction", "store.eviction_plan", ("EvictionPlan",)),
    ("policies.segments", "policies.service", ("ClientLiveness",)),
])
def test_moved_names_stay_importable_where_they_were(old: str, new: str, names: tuple[str, ...]) -> None:
    was, now = importlib.import_module(f"{PACKAGE}.{old}"), importlib.import_module(f"{PACKAGE}.{new}")
    for name in names:
        assert getattr(was, name) is getattr(now, name), name
