"""Cancelling jobs through POST /api/jobs/<id>/cancel/: who may, what it releases,
and what it refuses."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.models import Allocation, AuditEvent, Job, Node, Rack
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.users import ensure_user


def cancel_url(job) -> str:
    return f"/api/jobs/{job.pk}/cancel/"


def submit(user, *, num_gpus: int = 4, name: str = "job") -> Job:
    return job_services.submit_job(user, job_services.JobSpec(name=name, num_gpus=num_gpus))


def place_on_nodes(job: Job, nodes: list[Node]) -> Job:
    return job_allocations.apply_placement(
        None, job.pk, {node.id: [0, 1, 2, 3] for node in nodes}, reason="test placement"
    )


def cancel_events(job: Job):
    return AuditEvent.objects.filter(action="job.cancel", object_type="job", object_id=str(job.pk))


def test_a_submitter_can_cancel_their_own_pending_job(fleet, submitter, submitter_client):
    job = submit(submitter)

    response = submitter_client.post(cancel_url(job))

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == job.pk
    assert body["state"] == "cancelled"
    assert body["state_reason"] == "cancelled by sam"
    assert body["finished_at"] is not None
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert job.finished_at is not None
    event = cancel_events(job).get()
    assert event.actor == submitter
    assert event.before["state"] == "pending"
    assert event.after["state"] == "cancelled"


def test_cancelling_a_placed_job_releases_its_gpus(fleet, submitter, submitter_client):
    r1 = fleet[0]
    nodes = list(r1.nodes.order_by("slot")[:2])
    job = place_on_nodes(submit(submitter, num_gpus=8), nodes)
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 8
    version_before = Rack.objects.get(pk=r1.pk).version

    response = submitter_client.post(cancel_url(job))

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "cancelled"
    assert response.json()["allocated"] == []
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert Allocation.objects.filter(job=job, released_at__isnull=False).count() == 8
    r1.refresh_from_db()
    assert r1.version > version_before
    event = cancel_events(job).get()
    assert event.before["state"] == "placed"
    # The released GPUs can be given to another job straight away.
    again = place_on_nodes(submit(submitter, num_gpus=8, name="next"), nodes)
    assert again.state == "placed"
    assert Allocation.objects.filter(job=again, released_at__isnull=True).count() == 8


def test_cancelling_a_running_job_releases_its_gpus(fleet, submitter, submitter_client):
    node = fleet[0].nodes.get(slot=0)
    job = place_on_nodes(submit(submitter, num_gpus=4), [node])
    job_allocations.start_job(None, job.pk)

    response = submitter_client.post(cancel_url(job))

    assert response.status_code == 200, response.content
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert not Allocation.objects.filter(gpu__node=node, released_at__isnull=True).exists()


def _completed(job: Job) -> None:
    job_allocations.start_job(None, job.pk)
    job_allocations.finish_job(None, job.pk, succeeded=True)


def _failed(job: Job) -> None:
    job_allocations.start_job(None, job.pk)
    job_allocations.finish_job(None, job.pk, succeeded=False, reason="NCCL timeout")


@pytest.mark.parametrize(
    ("finish", "state"),
    [
        (_completed, "completed"),
        (_failed, "failed"),
        (lambda job: job_services.cancel_job(None, job.pk), "cancelled"),
    ],
)
def test_cancelling_a_finished_job_is_a_conflict(fleet, submitter, submitter_client, finish, state):
    node = fleet[0].nodes.get(slot=0)
    job = place_on_nodes(submit(submitter), [node])
    finish(job)
    job.refresh_from_db()
    assert job.state == state
    finished_at = job.finished_at
    events_before = AuditEvent.objects.count()

    response = submitter_client.post(cancel_url(job))

    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"job #{job.pk} is already {state}" in detail
    assert "only pending, placed, running or recovering jobs can be cancelled" in detail
    job.refresh_from_db()
    assert job.state == state
    assert job.finished_at == finished_at
    assert AuditEvent.objects.count() == events_before


def test_another_tenants_submitter_cannot_see_or_cancel_the_job(fleet, submitter, other_client):
    node = fleet[0].nodes.get(slot=0)
    job = place_on_nodes(submit(submitter), [node])

    assert other_client.get(f"/api/jobs/{job.pk}/").status_code == 404
    assert job.pk not in [j["id"] for j in other_client.get("/api/jobs/").json()["results"]]
    response = other_client.post(cancel_url(job))

    assert response.status_code == 404
    job.refresh_from_db()
    assert job.state == "placed"
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 4
    assert not cancel_events(job).exists()


def test_a_teammate_in_the_same_tenant_can_cancel_the_job(fleet, submitter):
    teammate, _ = ensure_user(None, "tina", role="submitter", tenants=["llm"])
    client = APIClient()
    client.force_authenticate(teammate)
    job = submit(submitter)

    response = client.post(cancel_url(job))

    assert response.status_code == 200, response.content
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert cancel_events(job).get().actor == teammate


def test_an_operator_can_cancel_anyones_job(fleet, submitter, operator, operator_client):
    node = fleet[1].nodes.get(slot=5)
    job = place_on_nodes(submit(submitter), [node])

    response = operator_client.post(cancel_url(job))

    assert response.status_code == 200, response.content
    assert response.json()["state_reason"] == "cancelled by olga"
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert cancel_events(job).get().actor == operator


def test_a_viewer_cannot_cancel_a_job(fleet, submitter, viewer_client):
    job = submit(submitter)

    response = viewer_client.post(cancel_url(job))

    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == "pending"
    assert not cancel_events(job).exists()


def test_cancelling_a_job_that_does_not_exist_is_not_found(fleet, operator_client):
    response = operator_client.post("/api/jobs/999999/cancel/")

    assert response.status_code == 404
    assert not AuditEvent.objects.filter(action="job.cancel").exists()
