"""The import circle services <-> executors <-> tasks is gone: neither the
cluster adapters (fleet.cluster) nor the services (fleet.services) import
fleet.tasks, at import time (checked in a fresh interpreter) or anywhere in
their code (checked statically, lazy imports inside functions included)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

PACKAGES = ("fleet.cluster", "fleet.services")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        folder = ROOT.joinpath(*package.split("."))
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_there_are_modules_to_check():
    assert {
        "fleet.cluster.base",
        "fleet.cluster.simulated",
        "fleet.cluster.webhook",
        "fleet.services.actions.propose",
        "fleet.services.execution.cluster_sync",
        "fleet.services.jobs.lifecycle",
    } <= set(_modules())


@pytest.mark.parametrize("module", _modules())
def test_importing_it_in_a_fresh_interpreter_does_not_load_fleet_tasks(module):
    code = (
        "import sys, django; django.setup(); import importlib; "
        f"importlib.import_module({module!r}); "
        "print('fleet.tasks' in sys.modules)"
    )
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "rackwise.settings", "DEBUG": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", f"importing {module} loaded fleet.tasks"


def _imports_of(path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


@pytest.mark.parametrize("module", _modules())
def test_no_code_in_it_imports_fleet_tasks(module):
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")

    offending = [
        name for name in _imports_of(path) if name == "fleet.tasks" or name.startswith("fleet.tasks.")
    ]

    assert offending == [], f"{module} imports {offending}"


def test_the_adapters_import_no_service_but_errors():
    """Adapters act on the outside world; services call them, not the reverse
    (a task sent by name goes through fleet.dispatch, below the services)."""
    for path in sorted(ROOT.joinpath("fleet", "cluster").glob("*.py")):
        services = {n for n in _imports_of(path) if n.startswith("fleet.services.")}
        services = {n for n in services if n.count(".") == 2}  # the modules, not the names from them
        assert services <= {"fleet.services.errors"}, (path.name, services)


# --- the layers, counted by scripts/import_graph.py ------------------------------------


def _import_graph():
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycle_and_no_import_up_a_floor():
    graph_tool = _import_graph()
    graph = graph_tool.imports(graph_tool.modules())

    assert graph_tool.cycles(graph) == []
    assert graph_tool.up_floor(graph) == []


ABOVE_OWNERS = ("decisions", "execution", "intake", "read")


def test_the_owner_rooms_never_import_decisions_execution_intake_or_read():
    graph_tool = _import_graph()
    graph = graph_tool.imports(graph_tool.modules())
    owners = [m for m in graph if m.startswith("fleet.services.") and m.split(".")[2] not in ABOVE_OWNERS]
    assert {
        "fleet.services.jobs.lifecycle",
        "fleet.services.nodes.moves",
        "fleet.services.actions.propose",
    } <= set(owners)
    above = {
        m: sorted(t for t in graph[m] if t.startswith("fleet.services.") and t.split(".")[2] in ABOVE_OWNERS)
        for m in owners
    }
    assert {m: t for m, t in above.items() if t} == {}


def test_the_counter_finds_a_cycle_and_an_import_up_a_floor():
    graph_tool = _import_graph()
    graph = {
        "fleet.models": {"fleet.services.jobs"},
        "fleet.services.jobs": {"fleet.models"},
        "placement": set(),
    }

    assert graph_tool.cycles(graph) == [["fleet.models", "fleet.services.jobs"]]
    assert graph_tool.up_floor(graph) == [("fleet.models", "fleet.services.jobs")]


def test_the_placement_engine_imports_neither_django_nor_fleet():
    for path in sorted(ROOT.joinpath("placement").rglob("*.py")):
        outside = [
            n
            for n in _imports_of(path)
            if n.split(".")[0] in ("django", "fleet", "rackwise", "rest_framework")
        ]
        assert outside == [], (path.relative_to(ROOT).as_posix(), outside)


WRITES = {
    "save",
    "delete",
    "update",
    "create",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
}


def test_the_adapters_write_no_rows():
    """They act on the outside world; what they learn goes back through the
    services (a step's outcome, its progress through a callback)."""
    for path in sorted(ROOT.joinpath("fleet", "cluster").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        writes = [
            f"{path.name}:{node.lineno}: {ast.unparse(node.func)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and "objects" in ast.unparse(node.func.value)
        ]
        assert writes == []


def test_the_adapters_read_no_placement_from_rows():
    """Hosts and segments come in the step they are handed (the executor's
    ``as_handed``), not from ``Allocation`` rows or ``Job.placement``."""
    for path in sorted(ROOT.joinpath("fleet", "cluster").glob("*.py")):
        text = path.read_text()
        assert "Allocation" not in text and ".placement" not in text, path.name
