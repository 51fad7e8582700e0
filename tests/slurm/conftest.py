"""Every test in tests/slurm/ gets the ``slurm`` marker, so ``-m 'not slurm'`` skips
them all and never starts the cluster (the fixture is in tests/slurm/cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import mark_directory

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    mark_directory(items, HERE, pytest.mark.slurm)
