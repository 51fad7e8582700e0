"""Slurm marks a node DOWN under a running 8-node job: Rackwise swaps it for a
spare in the same rack, Slurm runs the job on the 7 old nodes plus the spare,
and the console's grid shows the job on its new node and the failed one failed.

Real Slurm (tests/slurm/cluster.py), a real worker driving it, the real app
server and Chromium; the sync pass runs in the test process, as beat would."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Allocation, Job, Node
from fleet.services.execution import cluster_sync
from tests.browser.helpers import log_in_as, open_live
from tests.support import wait_for, workers

pytestmark = [pytest.mark.browser, pytest.mark.slurm]


def _sync_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        cluster_sync.sync()
        time.sleep(0.3)
    return result


def test_a_node_down_in_slurm_is_swapped_in_place_and_the_grid_shows_it(
    page, slurm_cluster, settings, operator, submitter
):
    cluster = slurm_cluster
    cluster.reset()
    settings.RACKWISE_CLUSTER = "slurm"
    settings.RACKWISE_SLURM_BIN = cluster.env["RACKWISE_SLURM_BIN"]
    settings.RACKWISE_SLURM_PARTITION = cluster.partition
    call_command("import_topology", "--from", "slurm-live", stdout=io.StringIO())
    env = cluster.env | {"RACKWISE_CLUSTER": "slurm"}
    with workers(1, env):
        from fleet.services.jobs.submit import JobSpec, submit_job

        job = submit_job(
            submitter,
            JobSpec(
                name="train",
                num_nodes=8,
                gpus_per_node=4,
                tenant="llm",
                slurm={"script": "#!/bin/bash\nsrun hostname\nsleep 600\n"},
            ),
        )
        wait_for(
            lambda: Job.objects.filter(pk=job.pk, state=JobState.RUNNING, external_id__isnull=False).exists(),
            40,
            "the job to run",
        )
        before = set(
            Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
                "gpu__node_id", flat=True
            )
        )
        victim = Node.objects.filter(pk__in=before).order_by("hostname")[2]

        log_in_as(page, operator)
        open_live(page)
        page.wait_for_function(f"window.rackwise.jobCells({job.pk}).length === 32")

        cluster.run("scontrol", "update", f"NodeName={victim.hostname}", "State=DOWN", "Reason=test: XID 79")
        _sync_until(
            lambda: Action.objects.filter(
                jobs=job, kind=ActionKind.RECOVERY, state=ActionState.SUCCEEDED
            ).exists(),
            60,
            "the swap",
        )
        external = Job.objects.get(pk=job.pk).external_id
        cluster.wait_job_state(external, "RUNNING", timeout=30)
        in_slurm = set(
            cluster.run("scontrol", "show", "hostnames", cluster.job(external)["nodes"]).stdout.split()
        )

    after = set(
        Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
            "gpu__node__hostname", flat=True
        )
    )
    assert in_slurm == after and victim.hostname not in after and len(after) == 8
    page.wait_for_function(
        f"""() => {{
          const cells = window.rackwise.jobCells({job.pk});
          const marked = window.rackwiseGrid.cells('main').filter(c => c.node === {victim.pk} && \
c.state === 'failed' && c.letter === 'F').length;
          return cells.length === 32 && cells.every(c => c.node !== {victim.pk}) && marked === 4;
        }}""",
        timeout=30000,
    )
    cells = page.evaluate(f"window.rackwise.jobCells({job.pk})")
    new_nodes = {c["node"] for c in cells} - before
    assert len(new_nodes) == 1
    assert {c["rack"] for c in cells} == {victim.rack_id}
