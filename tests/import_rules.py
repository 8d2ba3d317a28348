"""The package rules of DESIGN.md as data, and a checker that reads imports from the source
(AST, no code runs).

An import at module level is eager: it runs when the module is imported. One inside a
function or under `if TYPE_CHECKING:` is lazy. The layering (which project package may
import which), the rooms inside a package and the ban on circles hold for every import,
lazy ones included; the third-party packages a package must not load (torch for the router)
are followed through eager imports, across project modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

# package -> project packages it may import (itself always).
# config_kit (declaring settings) is at the bottom: every package may import it.
_RULES: dict[str, frozenset[str]] = {
    "config_kit": frozenset(),
    "models": frozenset(),
    "engine": frozenset({"models"}),
    "kv_transfer": frozenset(),
    "cluster": frozenset({"models"}),
    "node": frozenset({"engine", "kv_transfer", "cluster", "models"}),
    "prefill_node": frozenset({"node", "engine", "kv_transfer", "cluster", "models"}),
    "decode_node": frozenset({"node", "engine", "kv_transfer", "cluster", "models"}),
    "router": frozenset({"cluster", "models"}),
    "planner": frozenset({"cluster", "models"}),
    # the `splitserve` command: starts every role (its subcommands), so it imports them all
    "launcher": frozenset(
        {"models", "engine", "kv_transfer", "cluster", "node", "prefill_node", "decode_node"}
        | {"router", "planner", "bench"}
    ),
}
ALLOWED = {pkg: may | {"config_kit"} for pkg, may in _RULES.items()}
# package (or module) -> third-party packages that importing it must never load (eagerly,
# transitively).
HEAVY = frozenset({"torch", "triton", "transformers", "nixl", "nixl_cu12", "nixl_cu13"})
NEVER_LOADS: dict[str, frozenset[str]] = {
    "config_kit": HEAVY,
    "router": HEAVY,
    "planner": HEAVY,
    "cluster": HEAVY,
    "models": HEAVY,
    "launcher": HEAVY,  # `splitserve router` loads no torch: a subcommand is imported lazily
    # the declarations the launcher and the chart's schema read
    "engine.config": HEAVY,
    "kv_transfer.config": HEAVY,
    "node.settings": HEAVY,
}
PROJECT = frozenset({*ALLOWED, "bench"})

# package -> its rooms in levels, bottom first: a room imports only rooms of lower levels
# (and itself), so rooms of one level never import each other. A room is a sub-package or a
# top-level module; "__init__" is the package's own module. Every module is in a room.
ROOMS: dict[str, tuple[frozenset[str], ...]] = {
    "engine": (
        # KV dtypes and rows; log phases; CLI flags; which settings go together
        frozenset({"kv_format", "phases", "flags", "config_checks"}),
        frozenset({"config"}),
        frozenset({"cpu_kernels", "triton_kernels"}),
        frozenset({"model"}),
        frozenset({"kv", "lora", "admission"}),  # KV, blocks, tiers; adapters; request checks
        frozenset({"scheduler"}),
        frozenset({"outputs"}),
        frozenset({"sampling"}),
        frozenset({"step"}),
        frozenset({"speculative", "parallel", "pooling"}),
        frozenset({"engine"}),  # LLMEngine
        frozenset({"loop", "llm"}),
        frozenset({"cli"}),
        frozenset({"__init__"}),  # `from engine import LLM`
    ),
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    eager: bool
    line: int
    type_only: bool = False  # under `if TYPE_CHECKING:`
    file: str = ""  # the importing file, relative to the root
    # `pkg` of `from pkg import a, b` (a and b have edges of their own: a module, or a name of
    # pkg's own module): it loads pkg, but the dependency is on what the names resolve to
    from_base: bool = False

    @property
    def where(self) -> str:
        return f"{self.file or self.source}:{self.line}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def edges(root: Path, packages: Iterable[str] = PROJECT) -> list[Edge]:
    """Every import of every module under `root`'s `packages`."""
    out: list[Edge] = []
    for package in sorted(packages):
        for path in sorted((root / package).rglob("*.py")):
            name = module_name(root, path)
            is_package = path.name == "__init__.py"
            tree = ast.parse(path.read_text(), filename=str(path))
            file = path.relative_to(root).as_posix()
            out.extend(_edges_of(tree, name, is_package, file))
    return out


def _edges_of(tree: ast.Module, module: str, is_package: bool, file: str = "") -> Iterator[Edge]:
    in_function: set[int] = set()
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(id(inner) for inner in ast.walk(node))
        elif _is_type_checking(node):
            assert isinstance(node, ast.If)
            type_only.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    for node in ast.walk(tree):
        typed = id(node) in type_only
        eager = id(node) not in in_function and not typed
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(module, alias.name, eager, node.lineno, typed, file)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.module, node.level)
            yield Edge(module, base, eager, node.lineno, typed, file, from_base=True)
            for alias in node.names:  # `from pkg import submodule`
                yield Edge(module, f"{base}.{alias.name}", eager, node.lineno, typed, file)


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, is_package: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def violations(root: Path) -> list[str]:
    """Broken rules, one line each, naming the import (`file:line`) or the circle."""
    all_edges = edges(root)
    modules = {e.source for e in all_edges} | _all_modules(root)
    problems = [_layering(e) for e in all_edges]
    problems += _heavy_loads(all_edges, modules)
    problems += room_breaks(all_edges, modules)
    problems += [
        "import circle: " + ", ".join(f"{e.where} imports {e.target}" for e in circle)
        for circle in circles(all_edges, modules)
    ]
    return sorted(p for p in problems if p)


def _dependencies(all_edges: list[Edge], modules: set[str], parents: bool = False) -> list[Edge]:
    """The imports between project modules, each once, its target the module it depends on;
    every kind of import alike. A module's own parent packages (which run before it anyway)
    only with `parents`."""
    found: dict[tuple[str, int, str], Edge] = {}
    for e in all_edges:
        target = None if e.from_base else _owning_module(e.target, modules)
        if target is None or target == e.source:
            continue
        if not parents and e.source.startswith(f"{target}."):
            continue
        found.setdefault((e.source, e.line, target), replace(e, target=target))
    return list(found.values())


def room_breaks(all_edges: list[Edge], modules: set[str]) -> list[str]:
    """Imports of a room above the importing one (or beside it), and modules in no room."""
    problems = [
        f"{m} is in no room of {m.split('.')[0]} (tests/import_rules.py ROOMS)"
        for m in sorted(modules)
        if m.split(".")[0] in ROOMS and _room(m) is None
    ]
    for e in _dependencies(all_edges, modules, parents=True):
        package = e.source.split(".")[0]
        if package not in ROOMS or e.target.split(".")[0] != package:
            continue
        source_room, target_room = _room(e.source), _room(e.target)
        if source_room is None or target_room is None or source_room[0] == target_room[0]:
            continue
        if target_room[1] >= source_room[1]:
            problems.append(
                f"{e.where} imports {e.target} ({package} room {source_room[0]} may not import "
                f"room {target_room[0]}: rooms import only the levels below them)"
            )
    return problems


def _room(module: str) -> tuple[str, int] | None:
    """(room, level) of a module of a package with rooms."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    for level, rooms in enumerate(ROOMS[parts[0]]):
        if name in rooms:
            return name, level
    return None


def circles(all_edges: list[Edge], modules: set[str]) -> list[list[Edge]]:
    """Modules that import each other, through any kind of import (a deferred one in a
    function, or one for types, still ties the two modules together): one circle per group,
    as the imports that close it. `from pkg import mod` depends on `pkg.mod`, not on `pkg`'s
    own body."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in _dependencies(all_edges, modules):
        graph.setdefault(e.source, {}).setdefault(e.target, e)
    targets = {source: set(out) for source, out in graph.items()}
    return [
        _circle_through(sorted(group), graph)
        for group in _strongly_connected(targets)
        if len(group) > 1
    ]


def _circle_through(group: list[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """The shortest circle from the group's first module back to it (breadth first)."""
    start, members = group[0], set(group)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for module in frontier:
            for target, e in sorted(graph.get(module, {}).items()):
                if target not in members or target in came:
                    continue
                came[target] = e
                nxt.append(target)
        if start in came:
            break
        frontier = nxt
    path, module = [], start
    while True:
        e = came[module]
        path.append(e)
        module = e.source
        if module == start:
            return path[::-1]


def _owning_module(target: str, modules: set[str]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, iteratively (no recursion limit on deep graphs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found


def _all_modules(root: Path) -> set[str]:
    return {module_name(root, p) for pkg in PROJECT for p in (root / pkg).rglob("*.py")}


def _layering(edge: Edge) -> str | None:
    source_pkg = edge.source.split(".")[0]
    target_pkg = edge.target.split(".")[0]
    allowed = ALLOWED.get(source_pkg)
    if allowed is None or target_pkg not in PROJECT or target_pkg == source_pkg:
        return None
    if target_pkg in allowed:
        return None
    return f"{edge.where} imports {edge.target} ({source_pkg} may not import it)"


def _heavy_loads(all_edges: list[Edge], modules: set[str]) -> list[str]:
    eager: dict[str, list[Edge]] = {}
    for e in all_edges:
        if e.eager:
            eager.setdefault(e.source, []).append(e)
    problems = []
    for package, banned in NEVER_LOADS.items():
        starts = sorted(m for m in modules if m == package or m.startswith(f"{package}."))
        for chain in _reach(starts, eager, modules):
            last = chain[-1]
            if last.target.split(".")[0] in banned:
                path = " -> ".join([chain[0].source, *(e.target for e in chain)])
                problems.append(f"importing {package} loads {last.target}: {path}")
    return problems


def _reach(
    starts: list[str], eager: dict[str, list[Edge]], modules: set[str]
) -> Iterator[list[Edge]]:
    """Chains of eager imports from `starts` that end outside the project."""
    seen: set[str] = set()
    stack: list[tuple[str, list[Edge]]] = [(m, []) for m in starts]
    while stack:
        module, chain = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        for e in eager.get(module, []):
            if e.target in modules:
                stack.append((e.target, [*chain, e]))
                # importing a.b.c runs a/__init__ and a/b/__init__ first
                parent = e.target.rpartition(".")[0]
                while parent:
                    if parent in modules:
                        stack.append((parent, [*chain, e]))
                    parent = parent.rpartition(".")[0]
            elif e.target.split(".")[0] not in PROJECT:
                yield [*chain, e]
