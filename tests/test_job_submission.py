"""Submitting jobs through POST /api/jobs/: what is accepted and how it is
normalised, and every refusal with a message that says why and what would fit.

The ``fleet`` fixture is two NVL72 racks: 36 nodes x 4 GPUs, 144 GPUs, 18 nodes
per NVLink domain."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.models import AuditEvent, Job
from fleet.services.users import ensure_user

URL = "/api/jobs/"


def submit(client, **data):
    return client.post(URL, data, format="json")


def messages_for(response, field: str) -> str:
    body = response.json()
    assert field in body, f"expected an error on {field!r}, got {body}"
    return " ".join(body[field])


def assert_nothing_written() -> None:
    assert Job.objects.count() == 0
    assert not AuditEvent.objects.filter(object_type="job").exists()


def assert_refused(response, field: str, *fragments: str) -> None:
    assert response.status_code == 400, response.content
    text = messages_for(response, field)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    assert_nothing_written()


# --- accepted -------------------------------------------------------------------


def test_it_queues_a_sub_node_job_without_a_node_count(fleet, submitter, submitter_client):
    response = submit(submitter_client, name="notebook", num_gpus=2)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["num_gpus"] == 2
    assert body["num_nodes"] is None
    assert body["gpus_per_node"] is None
    assert body["segment_nodes"] is None
    assert body["state"] == "pending"
    assert body["owner"] == "sam"
    assert body["allocated"] == []
    job = Job.objects.get(pk=body["id"])
    assert (job.num_gpus, job.num_nodes, job.gpus_per_node, job.segment_nodes) == (2, None, None, None)
    assert job.owner == submitter
    assert job.state == "pending"


def test_it_treats_one_whole_node_of_gpus_as_a_sub_node_job(fleet, submitter_client):
    response = submit(submitter_client, name="one-node", num_gpus=4)

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.num_gpus, job.num_nodes, job.gpus_per_node) == (4, None, None)


def test_it_cuts_a_32_gpu_job_into_8_whole_nodes_sharing_one_rack(fleet, submitter_client):
    response = submit(submitter_client, name="pretrain", num_gpus=32)

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["num_gpus"], body["num_nodes"], body["gpus_per_node"]) == (32, 8, 4)
    assert body["segment_nodes"] == 8
    assert body["locality"] == "required"
    job = Job.objects.get(pk=body["id"])
    assert (job.num_gpus, job.num_nodes, job.gpus_per_node, job.segment_nodes) == (32, 8, 4, 8)


def test_it_accepts_a_job_given_as_nodes_times_gpus_per_node(fleet, submitter_client):
    response = submit(submitter_client, name="gang", num_nodes=6, gpus_per_node=4)

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.num_gpus, job.num_nodes, job.gpus_per_node, job.segment_nodes) == (24, 6, 4, 6)


def test_it_accepts_partial_nodes_per_gang_member(fleet, submitter_client):
    response = submit(submitter_client, name="half-nodes", num_nodes=4, gpus_per_node=2)

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.num_gpus, job.num_nodes, job.gpus_per_node, job.segment_nodes) == (8, 4, 2, 4)


def test_it_accepts_num_gpus_that_agrees_with_num_nodes_times_gpus_per_node(fleet, submitter_client):
    response = submit(submitter_client, name="all-three", num_gpus=8, num_nodes=2, gpus_per_node=4)

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.num_gpus, job.num_nodes, job.gpus_per_node) == (8, 2, 4)


def test_it_keeps_explicit_segments_for_a_24_node_preferred_job(fleet, submitter_client):
    response = submit(
        submitter_client, name="wide", num_nodes=24, gpus_per_node=4, segment_nodes=12, locality="preferred"
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["num_gpus"], body["num_nodes"], body["segment_nodes"], body["locality"]) == (
        96,
        24,
        12,
        "preferred",
    )
    job = Job.objects.get(pk=body["id"])
    assert (job.num_nodes, job.segment_nodes, job.locality) == (24, 12, "preferred")


def test_it_accepts_a_preferred_job_bigger_than_a_rack_without_segments(fleet, submitter_client):
    response = submit(submitter_client, name="spill", num_gpus=96, locality="preferred")

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.num_nodes, job.segment_nodes, job.locality) == (24, None, "preferred")


def test_it_accepts_a_required_job_bigger_than_a_rack_split_into_rack_local_segments(fleet, submitter_client):
    response = submit(submitter_client, name="segmented", num_gpus=96, segment_nodes=12)

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.num_nodes, job.segment_nodes, job.locality) == (24, 12, "required")


def test_it_accepts_a_job_using_every_gpu_in_the_fleet_when_it_may_span_racks(fleet, submitter_client):
    response = submit(submitter_client, name="everything", num_gpus=144, segment_nodes=18)

    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).num_nodes == 36


def test_the_tenant_defaults_to_the_submitters_only_tenant(fleet, submitter_client):
    response = submit(submitter_client, name="defaulted", num_gpus=1)

    assert response.status_code == 201, response.content
    assert response.json()["tenant"] == "llm"
    assert Job.objects.get(pk=response.json()["id"]).tenant.name == "llm"


def test_a_submitter_may_name_their_tenant_explicitly(fleet, submitter_client):
    response = submit(submitter_client, name="named", num_gpus=1, tenant="llm")

    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).tenant.name == "llm"


def test_it_stores_the_optional_scheduling_fields(fleet, submitter_client):
    response = submit(
        submitter_client,
        name="tuned",
        num_gpus=2,
        priority=50,
        preemptible=False,
        checkpoint_interval_s=600,
        expected_duration_s=7200,
    )

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.priority, job.preemptible, job.checkpoint_interval_s, job.expected_duration_s) == (
        50,
        False,
        600,
        7200,
    )


def test_it_writes_an_audit_record_for_the_submission(fleet, submitter, submitter_client):
    response = submit(submitter_client, name="audited", num_gpus=32)

    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    event = AuditEvent.objects.get(object_type="job")
    assert event.action == "job.submit"
    assert event.object_id == str(job_id)
    assert event.actor == submitter
    assert event.actor_name == "sam"
    assert event.after["state"] == "pending"
    assert event.after["num_gpus"] == 32
    assert event.request_id is not None


def test_an_operator_can_submit_for_any_existing_tenant(fleet, operator_client, other_submitter):
    response = submit(operator_client, name="ops-job", num_gpus=4, tenant="vision")

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.tenant.name == "vision"
    assert job.owner.username == "olga"


# --- refused --------------------------------------------------------------------


def test_it_refuses_more_gpus_than_the_whole_fleet_has(fleet, submitter_client):
    response = submit(submitter_client, name="too-big", num_gpus=145, locality="preferred")

    assert_refused(response, "num_gpus", "145", "whole fleet has 144")


def test_it_refuses_more_nodes_than_the_whole_fleet_has(fleet, submitter_client):
    response = submit(submitter_client, name="too-many", num_nodes=37, gpus_per_node=2, locality="preferred")

    assert_refused(response, "num_nodes", "37 nodes", "the fleet has 36 such nodes")


def test_too_many_whole_nodes_are_refused_by_the_field_that_was_sent(fleet, submitter_client):
    """37 nodes of 4 GPUs is also more GPUs than the fleet has; the user sent
    num_nodes, not num_gpus, so that is the field the message names."""
    response = submit(submitter_client, name="too-many", num_nodes=37, gpus_per_node=4, locality="preferred")

    assert_refused(response, "num_nodes", "37 nodes of 4 GPUs", "the fleet has 36 such nodes")


def test_it_refuses_a_required_job_bigger_than_a_rack(fleet, submitter_client):
    response = submit(submitter_client, name="rack-and-a-bit", num_gpus=80)

    assert_refused(
        response, "locality", "20 nodes", "largest domain (18 nodes, 72 GPUs)", "segment_nodes", "preferred"
    )


def test_it_refuses_a_required_gang_of_nodes_bigger_than_a_rack(fleet, submitter_client):
    response = submit(submitter_client, name="gang", num_nodes=19, gpus_per_node=4, locality="required")

    assert_refused(response, "locality", "19 nodes", "segment_nodes", "locality=preferred")


def test_it_refuses_gpus_per_node_larger_than_any_node(fleet, submitter_client):
    response = submit(submitter_client, name="fat-nodes", num_nodes=2, gpus_per_node=8)

    assert_refused(response, "gpus_per_node", "no node has 8 GPUs", "largest nodes have 4")


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize(
    ("field", "others"),
    [
        ("num_gpus", {}),
        ("num_nodes", {"gpus_per_node": 4}),
        ("gpus_per_node", {"num_nodes": 2}),
        ("segment_nodes", {"num_gpus": 32}),
    ],
)
def test_it_refuses_sizes_that_are_not_positive(fleet, submitter_client, field, others, value):
    response = submit(submitter_client, name="bad-size", **others, **{field: value})

    assert_refused(response, field, f"must be a positive integer, got {value}")


def test_it_refuses_an_unknown_locality_and_lists_the_known_ones(fleet, submitter_client):
    response = submit(submitter_client, name="where", num_gpus=2, locality="nearby")

    assert_refused(response, "locality", "unknown locality 'nearby'", "required", "preferred", "none")


def test_it_refuses_a_misspelt_field_instead_of_dropping_it(fleet, submitter_client):
    response = submit(submitter_client, name="typo", num_gpus=2, duration_s=3600)

    assert_refused(response, "duration_s", "unknown field", "expected_duration_s")


def test_it_refuses_a_misspelt_slurm_field(fleet, submitter_client):
    response = submit(submitter_client, name="typo", num_gpus=2, slurm={"comand": "hostname"})

    assert response.status_code == 400, response.content
    assert "unknown field" in str(response.json()["slurm.comand"])
    assert_nothing_written()


def test_it_refuses_num_nodes_without_gpus_per_node(fleet, submitter_client):
    response = submit(submitter_client, name="half-shape", num_nodes=4)

    assert_refused(response, "gpus_per_node", "gpus_per_node is required with num_nodes")


def test_it_refuses_gpus_per_node_without_num_nodes(fleet, submitter_client):
    response = submit(submitter_client, name="half-shape", num_gpus=8, gpus_per_node=4)

    assert_refused(response, "num_nodes", "num_nodes is required with gpus_per_node")


def test_it_refuses_a_job_with_no_size_at_all(fleet, submitter_client):
    response = submit(submitter_client, name="shapeless")

    assert_refused(response, "num_gpus", "give num_gpus, or num_nodes together with gpus_per_node")


def test_it_refuses_num_gpus_that_disagrees_with_num_nodes_times_gpus_per_node(fleet, submitter_client):
    response = submit(submitter_client, name="mismatch", num_gpus=10, num_nodes=2, gpus_per_node=4)

    assert_refused(
        response, "num_gpus", "num_gpus=10", "num_nodes x gpus_per_node = 8", "give one or the other"
    )


def test_it_refuses_a_segment_that_does_not_divide_the_job_and_suggests_divisors(fleet, submitter_client):
    response = submit(
        submitter_client, name="ragged", num_nodes=24, gpus_per_node=4, segment_nodes=5, locality="preferred"
    )

    assert_refused(
        response, "segment_nodes", "24 nodes cannot be cut into segments of 5", "divisor of 24", "6, 8, 12"
    )


def test_it_refuses_a_segment_bigger_than_a_rack(fleet, submitter_client):
    response = submit(
        submitter_client,
        name="huge-segment",
        num_nodes=36,
        gpus_per_node=4,
        segment_nodes=36,
        locality="preferred",
    )

    assert_refused(
        response, "segment_nodes", "a segment of 36 nodes cannot fit", "largest NVLink domain has 18 nodes"
    )


def test_it_refuses_a_segment_bigger_than_the_job(fleet, submitter_client):
    response = submit(submitter_client, name="over-segment", num_nodes=8, gpus_per_node=4, segment_nodes=9)

    assert_refused(response, "segment_nodes", "segment_nodes=9 is larger than the job's 8 nodes")


def test_it_refuses_an_unknown_tenant_and_names_the_submitters_tenants(fleet, submitter_client):
    response = submit(submitter_client, name="lost", num_gpus=1, tenant="nope")

    assert_refused(response, "tenant", "unknown tenant 'nope'", "yours: llm")


def test_it_refuses_another_tenant_as_if_it_did_not_exist(fleet, other_submitter, submitter_client):
    response = submit(submitter_client, name="trespass", num_gpus=1, tenant="vision")

    assert_refused(response, "tenant", "unknown tenant 'vision'", "yours: llm")


def test_it_asks_a_submitter_of_several_tenants_to_choose_one(fleet):
    user, _ = ensure_user(None, "tess", role="submitter", tenants=["llm", "vision"])
    client = APIClient()
    client.force_authenticate(user)

    response = submit(client, name="which", num_gpus=1)

    assert_refused(response, "tenant", "tenant is required", "llm", "vision")


def test_it_asks_an_operator_without_tenants_to_name_one(fleet, operator_client):
    response = submit(operator_client, name="ops", num_gpus=1)

    assert_refused(response, "tenant", "tenant is required", "you belong to no tenant")


def test_it_refuses_a_job_without_a_name(fleet, submitter_client):
    response = submit(submitter_client, num_gpus=2)

    assert_refused(response, "name", "required")


def test_it_refuses_a_blank_name(fleet, submitter_client):
    response = submit(submitter_client, name="", num_gpus=2)

    assert_refused(response, "name", "blank")


@pytest.mark.parametrize("field", ["checkpoint_interval_s", "expected_duration_s"])
def test_it_refuses_a_duration_too_large_to_store_instead_of_crashing(fleet, submitter_client, field):
    response = submit(submitter_client, name="forever", num_gpus=2, **{field: 10**10})

    assert_refused(response, field, "less than or equal to 2147483647")


def test_it_refuses_a_checkpoint_interval_under_a_minute(fleet, submitter_client):
    response = submit(submitter_client, name="chatty", num_gpus=2, checkpoint_interval_s=5)

    assert_refused(response, "checkpoint_interval_s", "greater than or equal to 60")


def test_it_refuses_every_job_while_the_fleet_has_no_racks(db, submitter_client):
    response = submit(submitter_client, name="early", num_gpus=1)

    assert_refused(response, "non_field_errors", "the fleet has no nodes yet")


def test_a_viewer_may_not_submit(fleet, viewer_client):
    response = submit(viewer_client, name="peek", num_gpus=1)

    assert response.status_code == 403
    assert "submitter" in response.json()["detail"]
    assert_nothing_written()


def test_an_anonymous_caller_may_not_submit(fleet, anon_client):
    response = submit(anon_client, name="anon", num_gpus=1)

    assert response.status_code in (401, 403)
    assert_nothing_written()


# --- #28 items 4 and 6: never more than asked; every missing field at once ----------


@pytest.mark.parametrize(
    "asked, offers",
    [(5, ["4 (1 node of 4)", "8 (2 nodes of 4)"]), (30, ["28 (7 nodes of 4)", "32 (8 nodes of 4)"])],
)
def test_a_gpu_count_that_is_not_whole_nodes_is_refused_with_the_shapes_that_fit(
    fleet, submitter_client, asked, offers
):
    """num_gpus: 5 was accepted and held 2 whole nodes (8 GPUs) without saying so."""
    response = submit(submitter_client, name="odd", num_gpus=asked)

    assert_refused(response, "num_gpus", f"{asked} GPUs is more than one node holds (4)", *offers)


def test_the_what_if_refuses_the_same_odd_count(fleet, submitter_client):
    response = submitter_client.post(f"{URL}what-if/", {"name": "odd", "num_gpus": 5}, format="json")

    assert response.status_code == 400
    assert "ask for 4 (1 node of 4) or 8 (2 nodes of 4)" in messages_for(response, "num_gpus")


def test_an_empty_request_names_every_missing_field_at_once(fleet, operator):
    """``{}`` got only ``name: required``; the tenant and the size came one
    retry at a time."""
    client = APIClient()
    client.force_authenticate(operator)  # an operator belongs to no tenant: it must name one

    response = client.post(URL, {}, format="json")

    assert response.status_code == 400
    assert set(response.json()) >= {"name", "tenant", "num_gpus"}
    assert "required" in messages_for(response, "name")
    assert "tenant is required" in messages_for(response, "tenant")
    assert "num_nodes together with gpus_per_node" in messages_for(response, "num_gpus")
    assert_nothing_written()


def test_a_submitter_with_one_tenant_is_not_asked_for_it(fleet, submitter_client):
    response = submit(submitter_client)

    assert response.status_code == 400
    assert set(response.json()) == {"name", "num_gpus"}
