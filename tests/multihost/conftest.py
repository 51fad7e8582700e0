"""Tests across several hosts (network namespaces on this machine): every test
here gets the ``multihost`` marker (``-m 'not multihost'`` skips them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import mark_directory

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    mark_directory(items, HERE, pytest.mark.multihost)
