"""Whole racks reserved for a tenant, through /api/tenants/: set and checked by
operators, audited, and followed by the scheduling pass (its gangs there first,
others' only while nothing else holds them)."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind
from fleet.models import Action, AuditEvent, Job, Quota, RackReservation
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs import submit as job_services
from fleet.services.tenants import quotas
from tests.support import carry_out, pass_carried_out

pytestmark = pytest.mark.django_db

LLM_RACK = {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 64}], "reserved_racks": ["r2"]}


def _gang(user, name, tenant, nodes=8):
    return job_services.submit_job(
        user,
        job_services.JobSpec(name=name, tenant=tenant, num_nodes=nodes, gpus_per_node=4, locality="required"),
    )


def _racks(job: Job) -> set[str]:
    job.refresh_from_db()
    return set(
        job.allocations.filter(released_at__isnull=True).values_list("gpu__node__rack__name", flat=True)
    )


def test_an_operator_reserves_a_rack_and_the_pass_sends_each_tenants_gangs_where_they_belong(
    fleet, operator_client, viewer_client, submitter, other_submitter
):
    response = operator_client.put("/api/tenants/llm/quotas/", LLM_RACK, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["reserved_racks"] == ["r2"]
    assert viewer_client.get("/api/tenants/vision/").json()["reserved_racks"] == []
    event = AuditEvent.objects.get(action="tenant.reserved_racks")
    assert (event.before, event.after) == ({"racks": []}, {"racks": ["r2"]})
    filler = _gang(submitter, "filler", "llm", nodes=8)
    schedule_pass()
    assert _racks(filler) == {"r2"}, "llm's work goes to its reserved rack first"
    # Best fit alone would put an 8-node gang into r2's 8 idle nodes.
    vision = _gang(other_submitter, "v", "vision", nodes=8)
    schedule_pass()
    assert _racks(vision) == {"r1"}
    _gang(other_submitter, "v2", "vision", nodes=8)
    schedule_pass()
    # When nothing else holds it, vision borrows the idle part of llm's rack.
    lent = _gang(other_submitter, "lent", "vision", nodes=8)
    schedule_pass()
    assert _racks(lent) == {"r2"}


def test_reserved_racks_must_fit_the_nominal_quota_exist_and_belong_to_nobody_else(
    fleet, operator_client, submitter_client, other_submitter
):
    bad = operator_client.put(
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 32}], "reserved_racks": ["r2", "r9", "r2"]},
        format="json",
    )
    assert bad.status_code == 400
    body = bad.json()
    assert body["reserved_racks[1]"] == ["no rack 'r9'; GET /api/racks/ lists them"]
    assert body["reserved_racks[2]"] == ["rack 'r2' is given twice"]
    assert body["reserved_racks"] == [
        "the reserved racks hold 64 GPUs on 4-GPU nodes (spare nodes not counted) and count towards "
        "the nominal quota, which is 32: give a nominal quota of at least 64 on 4-GPU nodes, "
        "or reserve fewer racks"
    ]
    assert not Quota.objects.exists() and not RackReservation.objects.exists()
    assert operator_client.put("/api/tenants/llm/quotas/", LLM_RACK, format="json").status_code == 200
    # Lowering the quota below the reserved rack is refused too.
    lower = operator_client.put(
        "/api/tenants/llm/quotas/", {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 8}]}, format="json"
    )
    assert lower.status_code == 400 and "reserve fewer racks" in lower.json()["quotas"][0]
    taken = operator_client.put(
        "/api/tenants/vision/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 64}], "reserved_racks": ["r2"]},
        format="json",
    )
    assert taken.status_code == 409
    assert taken.json()["detail"] == "rack r2 is reserved for llm; remove it from llm's reserved racks first"
    assert not Quota.objects.filter(tenant__name="vision").exists(), "nothing half-written"
    assert submitter_client.put("/api/tenants/llm/quotas/", LLM_RACK, format="json").status_code == 403
    freed = operator_client.put(
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 64}], "reserved_racks": []},
        format="json",
    )
    assert freed.status_code == 200 and freed.json()["reserved_racks"] == []


def test_a_tenant_reclaims_its_own_reserved_rack_from_borrowers(fleet, operator, submitter, other_submitter):
    quotas.set_quotas(operator, "llm", LLM_RACK["quotas"], reserved_racks=["r2"])
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    borrowed = [_gang(other_submitter, f"v{i}", "vision", nodes=4) for i in range(8)]
    pass_carried_out()
    assert set().union(*(_racks(j) for j in borrowed)) == {"r1", "r2"}, "vision borrows r2 while idle"
    gang = _gang(submitter, "gang", "llm", nodes=16)
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    victims = Job.objects.filter(pk__in=[s["job"] for s in action.steps if s["op"] == "preempt"])
    assert len(victims) == 4 and all(_racks(v) == {"r2"} for v in victims), "llm's own rack comes back"
    carry_out(action.pk)
    assert _racks(gang) == {"r2"}
