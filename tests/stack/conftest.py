"""The whole stack as a user runs it: ``./scripts/run --port P`` in a fresh copy of
the checkout, with nothing set (its own virtualenv, private PostgreSQL and
Redis, the demo workload). One stack per test session, shared by the tests in
this directory, which all get the ``stack`` marker (``-m 'not stack'`` skips
them and never starts it)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.soak import Stack, fresh_checkout
from tests.support import mark_directory

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    mark_directory(items, HERE, pytest.mark.stack)


@pytest.fixture(scope="session")
def quickstart_stack(tmp_path_factory) -> Iterator[Stack]:
    """The README's first command, from a fresh copy of this checkout (what a
    clone has, plus changes not yet committed), in a subprocess whose environment
    has only PATH and HOME. Stopped with Ctrl-C, as a user stops it."""
    checkout = fresh_checkout(tmp_path_factory.mktemp("quickstart") / "rackwise")
    stack = Stack(checkout).start()
    try:
        yield stack
    finally:
        stack.stop()
        # Ctrl-C stops everything it started (CI once left whole stacks running:
        # Ctrl-C never reached supervisord, and the SIGKILL fallback took only
        # scripts/run's process group, which supervisord's programs are not in).
        deadline = time.monotonic() + 30
        while (left := _running_from(checkout)) and time.monotonic() < deadline:
            time.sleep(1)
        assert not left, f"processes left running after Ctrl-C: {left}"


def _running_from(checkout: Path) -> list[str]:
    """Processes started from ``checkout`` (its virtualenv's Python, PostgreSQL, Redis)."""
    return subprocess.run(["pgrep", "-f", str(checkout)], capture_output=True, text=True).stdout.split()
