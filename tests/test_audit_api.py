"""GET /api/audit/: the audit log. Viewers and operators read all of it; a
submitter reads their own actions and the events of their tenants' jobs."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.models import AuditEvent, Job
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services

URL = "/api/audit/"


def events(client, query: str = "") -> list[dict]:
    response = client.get(URL + query)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == len(body["results"])
    return body["results"]


def keys(results: list[dict]) -> set[tuple[str, str, str]]:
    return {(e["actor_name"], e["action"], e["object_id"]) for e in results}


@pytest.fixture
def history(fleet, submitter, other_submitter, operator) -> dict[str, Job]:
    """sam submits an llm job which olga cancels; otto submits a vision job; olga
    drains a node."""
    mine = job_services.submit_job(submitter, job_services.JobSpec(name="llm-run", num_gpus=4))
    theirs = job_services.submit_job(other_submitter, job_services.JobSpec(name="vision-run", num_gpus=4))
    job_services.cancel_job(operator, mine.pk)
    node_services.drain_node(operator, fleet[0].nodes.get(slot=0).pk, "maintenance")
    return {"mine": mine, "theirs": theirs}


@pytest.mark.parametrize("client_fixture", ["viewer_client", "operator_client"])
def test_viewers_and_operators_see_every_event(request, history, client_fixture):
    client = request.getfixturevalue(client_fixture)

    results = events(client)

    assert len(results) == AuditEvent.objects.count()
    assert {
        ("sam", "job.submit", str(history["mine"].pk)),
        ("otto", "job.submit", str(history["theirs"].pk)),
        ("olga", "job.cancel", str(history["mine"].pk)),
    } <= keys(results)
    assert {"rack.create", "user.create", "node.drain"} <= {e["action"] for e in results}


def test_events_come_newest_first_with_their_details(history, operator_client):
    results = events(operator_client)

    newest = results[0]
    assert newest["action"] == "node.drain"
    assert newest["actor_name"] == "olga"
    assert newest["object_type"] == "node"
    assert newest["object_repr"] == "r1-n00"
    assert newest["message"] == "maintenance"
    assert newest["before"] == {"state": "healthy", "state_reason": ""}
    assert newest["after"] == {"state": "drained", "state_reason": "maintenance"}
    ids = [e["id"] for e in results]
    assert ids == sorted(ids, reverse=True)


def test_a_submitter_sees_their_own_actions_and_their_tenants_jobs_only(history, submitter_client):
    results = events(submitter_client)

    assert keys(results) == {
        ("sam", "job.submit", str(history["mine"].pk)),
        ("olga", "job.cancel", str(history["mine"].pk)),
    }
    assert "vision-run" not in str(results)


def test_the_other_tenants_submitter_sees_only_their_side(history, other_client):
    results = events(other_client)

    assert keys(results) == {("otto", "job.submit", str(history["theirs"].pk))}


def test_a_submitter_keeps_seeing_their_own_actions_after_leaving_the_tenant(history, submitter):
    submitter.tenants.clear()
    client = APIClient()
    client.force_authenticate(submitter)

    results = events(client)

    # Their own submission stays visible; the operator's cancel of that job does not.
    assert keys(results) == {("sam", "job.submit", str(history["mine"].pk))}


def test_events_can_be_filtered_by_action_prefix(history, viewer_client):
    assert {e["action"] for e in events(viewer_client, "?action=job.")} == {"job.submit", "job.cancel"}
    assert keys(events(viewer_client, "?action=job.cancel")) == {
        ("olga", "job.cancel", str(history["mine"].pk))
    }
    assert events(viewer_client, "?action=nothing") == []


def test_events_can_be_filtered_by_object_type(history, fleet, viewer_client):
    nodes = events(viewer_client, "?object_type=node")
    racks = events(viewer_client, "?object_type=rack")

    assert [(e["action"], e["object_repr"]) for e in nodes] == [("node.drain", "r1-n00")]
    assert {e["object_repr"] for e in racks} == {"r1", "r2"}
    assert all(e["object_type"] == "rack" for e in racks)


def test_events_can_be_filtered_by_object_and_actor(history, viewer_client):
    job_id = str(history["mine"].pk)

    by_object = events(viewer_client, f"?object_type=job&object_id={job_id}")
    by_actor = events(viewer_client, "?actor=olga")

    assert [e["action"] for e in by_object] == ["job.cancel", "job.submit"]
    assert {e["action"] for e in by_actor} == {"job.cancel", "node.drain"}


def test_filters_cannot_widen_what_a_submitter_sees(history, submitter_client):
    assert events(submitter_client, "?object_type=node") == []
    assert events(submitter_client, f"?object_id={history['theirs'].pk}") == []
    assert keys(events(submitter_client, "?action=job.cancel")) == {
        ("olga", "job.cancel", str(history["mine"].pk))
    }


def test_a_submitter_cannot_read_another_tenants_event_by_id(history, submitter_client):
    event = AuditEvent.objects.get(action="job.submit", object_id=str(history["theirs"].pk))

    assert submitter_client.get(f"{URL}{event.pk}/").status_code == 404


def test_someone_without_a_role_cannot_read_the_audit_log(history, outsider_client):
    response = outsider_client.get(URL)

    assert response.status_code == 403
    assert "results" not in response.json()


def test_the_audit_log_cannot_be_written_through_the_api(history, operator_client):
    before = AuditEvent.objects.count()

    response = operator_client.post(URL, {"action": "job.submit", "object_type": "job"}, format="json")

    assert response.status_code == 405
    assert AuditEvent.objects.count() == before
