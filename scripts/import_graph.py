#!/usr/bin/env python3
"""Count the import cycles and the imports that run up a floor in Rackwise's
own modules (``placement``, ``fleet``, ``rackwise``), and how many floors deep
the services' imports go. Exit 1 if any cycle or up-floor import is found.

Every import counts, inside functions too; only ``if TYPE_CHECKING:`` blocks
are left out (they never run). Usage: ``python scripts/import_graph.py [-v]``
(``-v`` lists each module's floor and the services' import chain).

Floors, lowest first; a module may import its own floor or any below it, never
one above. The longest matching prefix decides a module's floor.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("placement", "fleet", "rackwise")

FLOORS: list[tuple[str, tuple[str, ...]]] = [
    # The placement engine: pure Python, no Django, no fleet.
    ("engine", ("placement",)),
    # Models, settings, the Celery app, the step dataclasses, the task
    # dispatcher and the plain helpers every layer uses; service errors are
    # shared words.
    ("core", ("fleet", "rackwise", "fleet.services.errors")),
    # Cluster adapters act on the outside world and import no service.
    ("cluster", ("fleet.cluster",)),
    # Services, the owner rooms: each aggregate's lifecycle and the only
    # writers of its rows (jobs, nodes, actions), and what they share (audit,
    # rack versions, outbound webhooks, users).
    ("owners", ("fleet.services",)),
    # Services that decide, carry out, take in and read, through the owners.
    (
        "services",
        (
            "fleet.services.decisions",
            "fleet.services.execution",
            "fleet.services.intake",
            "fleet.services.read",
        ),
    ),
    # Entry points: what the web server, workers and commands load.
    (
        "entry",
        (
            "fleet.tasks",
            "fleet.api",
            "fleet.views",
            "fleet.consumers",
            "fleet.management",
            "fleet.admin",
            "fleet.urls",
            "fleet.apps",
            "fleet.prometheus",
            "fleet.export",
            "fleet.middleware",
            "fleet.context_processors",
            "fleet.templatetags",
            "fleet.filtersets",
            "fleet.reporting",
            "rackwise.urls",
            "rackwise.asgi",
            "rackwise.wsgi",
            "rackwise.routing",
        ),
    ),
]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def floor_of(module: str) -> int:
    best, floor = -1, 0
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), index
    return floor


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the known modules it imports (a name imported from a module
    counts as that module, or as the submodule of that name)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                # ``from package import module`` imports the module (the
                # package's __init__ runs too, but names nothing of it).
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for name in names:
                target = resolve(name)
                # A package's own __init__ is loaded with it: not an edge.
                if target and target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def up_floor(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, targets in graph.items() for t in targets if floor_of(t) > floor_of(m))


def depth(graph: dict[str, set[str]], prefix: str) -> tuple[int, list[str]]:
    """How many floors deep the imports among modules under ``prefix`` go (the
    longest chain), and that chain. The graph must have no cycle."""
    inside = {m for m in graph if m == prefix or m.startswith(prefix + ".")}
    memo: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in memo:
            below = [chain(t) for t in graph[module] if t in inside]
            memo[module] = [module, *max(below, key=len, default=[])]
        return memo[module]

    longest = max((chain(m) for m in inside), key=len, default=[])
    return len(longest), longest


def main(argv: list[str]) -> int:
    known = modules()
    graph = imports(known)
    found_cycles = cycles(graph)
    found_up = up_floor(graph)
    print(f"{len(known)} modules, {sum(len(t) for t in graph.values())} imports between them")
    print(f"import cycles: {len(found_cycles)}")
    for component in found_cycles:
        print("  " + " <-> ".join(component))
    print(f"imports up a floor: {len(found_up)}")
    for module, target in found_up:
        print(f"  {module} ({FLOORS[floor_of(module)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})")
    if not found_cycles:
        floors, longest = depth(graph, "fleet.services")
        print(f"fleet.services: {floors} floors deep")
        if "-v" in argv:
            print("  " + " -> ".join(longest))
            for module in sorted(known):
                print(f"  {FLOORS[floor_of(module)][0]:9} {module}")
    return 1 if found_cycles or found_up else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
