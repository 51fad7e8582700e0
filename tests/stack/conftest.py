"""The whole stack as a user runs it: ``./scripts/run --port P`` in a fresh copy of
the checkout, with nothing set (its own virtualenv, private PostgreSQL and
Redis, the demo workload). One stack per test session, shared by the tests in
this directory, which all get the ``stack`` marker (``-m 'not stack'`` skips
them and never starts it)."""

from __future__ import annotations

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
