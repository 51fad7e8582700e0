"""Reconcile repairs drift through the services: GPUs still held by a job that no
longer holds any are released (audited, the rack repainted), and a draining node
left empty becomes drained."""

from __future__ import annotations

from fleet.choices import JobState, NodeState
from fleet.models import Allocation, AuditEvent, Job, Rack
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from fleet.tasks import reconcile_once


def test_gpus_held_by_a_finished_job_are_released_and_the_rack_repainted(fleet, submitter, operator):
    node = fleet[0].nodes.get(slot=2)
    job = job_services.submit_job(submitter, job_services.JobSpec(name="train", num_gpus=4))
    job_allocations.apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")
    node_services.drain_node(operator, node.pk, "maintenance")
    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED)  # drift: the release never ran
    version = Rack.objects.get(pk=node.rack_id).version

    done = reconcile_once()

    assert done["released"] == [job.pk]
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert AuditEvent.objects.filter(action="allocation.release_drift", object_id=str(job.pk)).exists()
    node.refresh_from_db()
    assert node.state == NodeState.DRAINED
    assert Rack.objects.get(pk=node.rack_id).version > version
    assert reconcile_once()["released"] == []  # nothing left to repair
