"""Job logs on the real Slurm 24.11 (#32): a job submitted through the API, run
by a real worker, prints lines; a follower reads them through
``GET /api/jobs/<id>/logs/`` by ``offset`` (as ``rackwise logs -f`` does)
while the job runs, and stops at ``eof`` once the sync pass has seen it end.
The output file is Slurm's own (``--output`` in the jobs directory)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from fleet.models import Job
from fleet.services.execution import cluster_sync
from fleet.services.users import ensure_user
from tests.slurm.test_slurm_end_to_end import rackwise_hostnames, running_in_slurm, worker_env
from tests.support import AppServer, wait_for, workers

pytestmark = pytest.mark.django_db(transaction=True)

# Prints a line, another from srun on the node, one with a secret, then ends
# after a pause long enough for a follower to see the first while it runs.
SCRIPT = (
    "#!/bin/bash\n"
    "echo 'hello from rackwise'\n"
    "srun bash -c 'echo \"on $SLURMD_NODENAME GPUs $CUDA_VISIBLE_DEVICES\"'\n"
    'echo "HF_TOKEN=$HF_TOKEN"\n'
    "sleep 4\n"
    "echo 'training done'\n"
)


TOKEN = "hf_" + "x7Q" * 12


@pytest.fixture
def slurm_fleet(slurm_cluster, settings, submitter):
    """The fleet imported from the test Slurm, this process driving it (as in
    tests/slurm/test_slurm_end_to_end.py)."""
    slurm_cluster.reset()
    settings.RACKWISE_CLUSTER = "slurm"
    settings.RACKWISE_SLURM_BIN = slurm_cluster.env["RACKWISE_SLURM_BIN"]
    settings.RACKWISE_SLURM_PARTITION = slurm_cluster.partition
    settings.RACKWISE_SLURM_JOBS_DIR = str(slurm_cluster.jobs_dir)
    settings.RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER = slurm_cluster.jobs_dir_in_cluster
    call_command("import_topology", "--from", "slurm-live", stdout=io.StringIO())
    return slurm_cluster


def test_a_jobs_printed_lines_are_followed_through_the_api_until_eof(slurm_fleet, submitter_client):
    cluster = slurm_fleet
    with workers(1, worker_env(cluster)):
        response = submitter_client.post(
            "/api/jobs/",
            {
                "name": "hello",
                "num_nodes": 1,
                "gpus_per_node": 4,
                "slurm": {"script": SCRIPT, "env": {"HF_TOKEN": TOKEN}},
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        job_id = response.json()["id"]
        job = wait_for(lambda: running_in_slurm(cluster, job_id), 40, "the job to run in Slurm")
        (host,) = rackwise_hostnames(job_id)
        # An engineer follows it too, with the command line client, through a
        # real web server that reads Slurm's output file.
        _, token = ensure_user(None, "logs-reader", role="viewer")
        server = AppServer(worker_env(cluster)).start()
        follower = subprocess.Popen(
            [str(Path(sys.executable).parent / "rackwise"), "logs", "-f", str(job_id)],
            env=os.environ | {"RACKWISE_SERVER": server.url, "RACKWISE_TOKEN": token},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        lines: list[str] = []
        seen_running: list[str] = []
        offset = 0
        deadline = time.monotonic() + 60
        while True:
            cluster_sync.sync()  # as beat would: the job's end reaches Rackwise
            response = submitter_client.get(f"/api/jobs/{job_id}/logs/?offset={offset}")
            assert response.status_code == 200, response.content
            answer = response.json()
            assert answer["source"] == "slurm" and answer["offset"] == offset
            assert TOKEN not in response.content.decode()
            lines += answer["lines"]
            if not answer["finished"]:
                seen_running += answer["lines"]
            offset = answer["next_offset"]
            if answer["eof"]:
                break
            assert time.monotonic() < deadline, f"no eof after 60 s: {answer}"
            time.sleep(0 if answer["more"] else min(answer["poll_after_s"], 0.3))
        try:
            out, err = follower.communicate(timeout=30)  # it polls every 2 s until eof
        finally:
            follower.kill()
            server.stop()

    assert "hello from rackwise" in seen_running  # followed live, not read afterwards
    assert lines[0] == "hello from rackwise"
    assert lines[1] == f"on {host} GPUs 0,1,2,3"
    assert lines[2:] == ["HF_TOKEN=[redacted]", "training done"]
    assert Job.objects.get(pk=job_id).state == "completed"
    assert follower.returncode == 0, err
    assert out.splitlines() == lines, "rackwise logs -f printed what the job printed, redacted"
    # Redacted on the way out only: Slurm's file holds what the job printed.
    assert TOKEN in (cluster.jobs_dir / f"rackwise-{job_id}-{job.external_id}.out").read_text()
