"""/api/tenants/: quotas, usage, borrowing and fair share; operators edit quotas."""

from __future__ import annotations

import pytest

from fleet.models import AuditEvent, Quota
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs import submit as job_services

pytestmark = pytest.mark.django_db


def test_an_operator_sets_a_quota_and_every_reader_sees_the_figures(
    fleet, operator_client, viewer_client, submitter
):
    response = operator_client.put(
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 64, "borrowing_limit_gpus": 32}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    job_services.submit_job(
        submitter,
        job_services.JobSpec(name="big", tenant="llm", num_nodes=25, gpus_per_node=4, locality="preferred"),
    )
    schedule_pass()
    llm = viewer_client.get("/api/tenants/llm/").json()
    assert llm["quotas"] == [
        {
            "gpus_per_node": 4,
            "nominal_gpus": 64,
            "borrowing_limit_gpus": 32,
            "lending_limit_gpus": None,
            "in_use_gpus": 0,
            "borrowed_gpus": 0,
            "lent_gpus": 0,
            "pending_gpus": 100,
            "fair_share_gpus": 100,
            "cohort_capacity_gpus": 128,
        }
    ]
    assert (llm["pending_jobs"], llm["pending_gpus"], llm["weight"]) == (1, 100, 1.0)
    assert AuditEvent.objects.filter(action="tenant.quota", actor__username="olga").count() == 1
    job = viewer_client.get("/api/jobs/").json()["results"][0]
    assert job["state_reason"] == (
        "quota: llm holds 0 of 64 nominal GPUs and may borrow 32: this job's 100 GPUs would borrow 36"
    )


def test_the_parsers_and_the_services_refusals_name_a_field_by_one_path(fleet, operator_client, submitter):
    """Before, the parser's messages came nested ({"quotas": {"1": {...}}}) and the
    service's flat ("quotas[1].nominal_gpus") from the same endpoint."""

    def refused(body: dict) -> dict:
        response = operator_client.put("/api/tenants/llm/quotas/", body, format="json")
        assert response.status_code == 400, response.content
        return response.json()

    good = [{"gpus_per_node": 4, "nominal_gpus": 8}]
    parser = refused({"quotas": [{**good[0], "lending_limit_gpus": -1}]})
    service = refused({"quotas": [{**good[0], "nominal_gpus": 10_000}]})
    parser_racks = refused({"quotas": good, "reserved_racks": ["x" * 101]})
    service_racks = refused({"quotas": good, "reserved_racks": ["r9"]})

    assert parser == {"quotas[0].lending_limit_gpus": ["Ensure this value is greater than or equal to 0."]}
    assert list(service) == ["quotas[0].nominal_gpus"]
    assert list(parser_racks) == list(service_racks) == ["reserved_racks[0]"]
    assert service_racks["reserved_racks[0]"] == ["no rack 'r9'; GET /api/racks/ lists them"]
    assert not Quota.objects.exists()


def test_a_quota_beyond_the_fleet_is_a_400_naming_the_field_and_nothing_changes(
    fleet, operator_client, submitter
):
    response = operator_client.put(
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 10_000}, {"gpus_per_node": 4, "nominal_gpus": -1}]},
        format="json",
    )
    assert response.status_code == 400
    assert "nominal_gpus" in str(response.json())
    response = operator_client.put(
        "/api/tenants/llm/quotas/", {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 10_000}]}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["quotas[0].nominal_gpus"] == [
        "10000 GPUs is more than the fleet's 128 GPUs on 4-GPU nodes (spare nodes not counted)"
    ]
    assert not Quota.objects.exists()
    assert (
        operator_client.put("/api/tenants/nobody/quotas/", {"quotas": []}, format="json").status_code == 404
    )
    assert operator_client.patch("/api/tenants/llm/", {"weight": 0}, format="json").status_code == 400


def test_quotas_that_would_promise_more_than_the_fleet_are_a_409_and_nothing_changes(
    fleet, operator_client, submitter, other_submitter
):
    put = {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 96}]}
    assert operator_client.put("/api/tenants/vision/quotas/", put, format="json").status_code == 200
    response = operator_client.put("/api/tenants/llm/quotas/", put, format="json")
    assert response.status_code == 409
    assert "give at most 32" in response.json()["detail"]
    assert list(Quota.objects.values_list("tenant__name", "nominal_gpus")) == [("vision", 96)]


def test_weight_and_cohort_are_changed_by_operators_and_audited(
    fleet, operator_client, submitter, other_submitter
):
    response = operator_client.patch("/api/tenants/llm/", {"weight": 3, "cohort": "research"}, format="json")
    assert response.status_code == 200
    assert (response.json()["weight"], response.json()["cohort"], response.json()["fair_share"]) == (
        3.0,
        "research",
        0.75,
    )
    event = AuditEvent.objects.get(action="tenant.share")
    assert event.before == {"weight": 1.0, "cohort": "fleet"} and event.after == {
        "weight": 3.0,
        "cohort": "research",
    }
