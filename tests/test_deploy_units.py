"""The multi-host deployment's systemd units (deploy/systemd/) are valid for
systemd (``systemd-analyze verify``, with the install path and user of this
machine) and together serve every queue Rackwise sends work to."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.prometheus import celery_queues

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_units_verify(tmp_path):
    names = []
    for unit in [*UNITS.glob("*.service"), *UNITS.glob("*.timer")]:
        text = unit.read_text().replace("/opt/rackwise", str(ROOT)).replace("User=rackwise", "User=root")
        text = text.replace("EnvironmentFile=/etc/rackwise/env", "EnvironmentFile=-/etc/rackwise/env")
        name = unit.name.replace("@.service", "@celery.service")
        (tmp_path / name).write_text(text)
        names.append(f"./{name}")
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_worker_units_serve_every_queue():
    example = (UNITS / "rackwise-worker@.service").read_text()  # its enable line names one unit per queue
    for queue in celery_queues():
        assert f"rackwise-worker@{queue}" in example, f"the units start no worker for queue {queue}"
    assert "CONCURRENCY=1" in (UNITS / "rackwise-worker@scheduler.service.d" / "concurrency.conf").read_text()
