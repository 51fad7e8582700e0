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
        names.append(package)
        names += [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]
    return names


def test_there_are_modules_to_check():
    assert {"fleet.cluster.base", "fleet.cluster.simulated", "fleet.cluster.webhook", "fleet.services.actions",
            "fleet.services.cluster_sync"} <= set(_modules())


@pytest.mark.parametrize("module", _modules())
def test_importing_it_in_a_fresh_interpreter_does_not_load_fleet_tasks(module):
    code = (
        "import sys, django; django.setup(); import importlib; "
        f"importlib.import_module({module!r}); "
        "print('fleet.tasks' in sys.modules)"
    )
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "rackwise.settings", "DEBUG": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

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

    offending = [name for name in _imports_of(path) if name == "fleet.tasks" or name.startswith("fleet.tasks.")]

    assert offending == [], f"{module} imports {offending}"


def test_the_adapters_import_no_service_but_errors_and_dispatch():
    """Adapters act on the outside world; services call them, not the reverse
    (sending a task by name through fleet.services.dispatch is allowed)."""
    for path in sorted(ROOT.joinpath("fleet", "cluster").glob("*.py")):
        services = {n for n in _imports_of(path) if n.startswith("fleet.services.")}
        services = {n for n in services if n.count(".") == 2}  # the modules, not the names from them
        assert services <= {"fleet.services.errors", "fleet.services.dispatch"}, (path.name, services)


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


def test_the_counter_finds_a_cycle_and_an_import_up_a_floor():
    graph_tool = _import_graph()
    graph = {"fleet.models": {"fleet.services.jobs"}, "fleet.services.jobs": {"fleet.models"}, "placement": set()}

    assert graph_tool.cycles(graph) == [["fleet.models", "fleet.services.jobs"]]
    assert graph_tool.up_floor(graph) == [("fleet.models", "fleet.services.jobs")]


def test_the_placement_engine_imports_neither_django_nor_fleet():
    for path in sorted(ROOT.joinpath("placement").rglob("*.py")):
        outside = [n for n in _imports_of(path) if n.split(".")[0] in ("django", "fleet", "rackwise", "rest_framework")]
        assert outside == [], (path.relative_to(ROOT).as_posix(), outside)


WRITES = {"save", "delete", "update", "create", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}


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
