"""Job submission with an idempotency key: a retried submission returns the job
the first one created (200, same job) instead of a second job; the same key with
a different request is a 409; keys are per tenant."""

from __future__ import annotations

import pytest

from fleet.models import Job

BODY = {"name": "train", "num_gpus": 4, "tenant": "llm"}


def test_a_retry_with_the_same_idempotency_key_header_returns_the_same_job_with_200(fleet, submitter_client):
    first = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-1")

    assert first.status_code == 201, first.content
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert again.json() == first.json()
    assert Job.objects.count() == 1


def test_the_key_may_come_in_the_body_instead_of_the_header(fleet, submitter_client):
    body = BODY | {"idempotency_key": "k-2"}
    first = submitter_client.post("/api/jobs/", body, format="json")
    again = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-2")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]


def test_it_refuses_a_reused_key_with_a_different_request_with_409(fleet, submitter_client):
    first = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-3")
    other = submitter_client.post(
        "/api/jobs/", BODY | {"num_gpus": 8}, format="json", HTTP_IDEMPOTENCY_KEY="k-3"
    )

    assert other.status_code == 409, other.content
    assert "k-3" in other.json()["detail"] and f"#{first.json()['id']}" in other.json()["detail"]
    assert Job.objects.count() == 1


def test_leaving_out_ones_only_tenant_is_the_same_request_as_naming_it(fleet, submitter_client):
    first = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-4")
    again = submitter_client.post(
        "/api/jobs/",
        {k: v for k, v in BODY.items() if k != "tenant"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-4",
    )

    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_keys_are_unique_per_tenant_not_across_tenants(fleet, submitter_client, other_client):
    mine = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    theirs = other_client.post(
        "/api/jobs/", BODY | {"tenant": "vision"}, format="json", HTTP_IDEMPOTENCY_KEY="shared"
    )

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


def test_it_refuses_a_header_and_a_body_key_that_differ_with_400(fleet, submitter_client):
    response = submitter_client.post(
        "/api/jobs/", BODY | {"idempotency_key": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="b"
    )

    assert response.status_code == 400
    assert "idempotency_key" in response.json()
    assert not Job.objects.exists()


@pytest.mark.parametrize("key", ["x" * 201, "   "])
def test_it_refuses_an_empty_or_overlong_key_header_with_400(fleet, submitter_client, key):
    response = submitter_client.post("/api/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert response.status_code == 400
    assert "1 to 200 characters" in response.json()["idempotency_key"][0]


def test_submissions_without_a_key_each_create_a_job(fleet, submitter_client):
    codes = [submitter_client.post("/api/jobs/", BODY, format="json").status_code for _ in range(2)]

    assert codes == [201, 201]
    assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_two_jobs_with_one_key_in_a_tenant(fleet, submitter):
    from django.db import IntegrityError

    from fleet.models import Tenant

    llm = Tenant.objects.get(name="llm")
    Job.objects.create(name="a", owner=submitter, tenant=llm, num_gpus=1, idempotency_key="dup")
    with pytest.raises(IntegrityError):
        Job.objects.create(name="b", owner=submitter, tenant=llm, num_gpus=1, idempotency_key="dup")
