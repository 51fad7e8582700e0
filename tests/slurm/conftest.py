"""Every test in tests/slurm/ gets the ``slurm`` marker, so ``-m 'not slurm'`` skips
them all and never starts the cluster (the fixture is in tests/slurm/cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: the marker must be on the items before `-m` deselects by it.
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slurm)
