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
