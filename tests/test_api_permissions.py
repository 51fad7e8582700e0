"""The permission matrix: every endpoint against every persona.

Expected codes per persona: anonymous 401, outsider (no role) 403, viewer reads,
submitter submits/cancels within its tenant and reads, operator does everything.
"""

from __future__ import annotations

import pytest

from fleet.models import Job, Node
from fleet.services.jobs.submit import JobSpec, submit_job

ANON, OUTSIDER, VIEWER, OTHER, OPERATOR = "anon", "outsider", "viewer", "other", "operator"


@pytest.fixture
def llm_job(fleet, submitter):
    return submit_job(submitter, JobSpec(name="llm-train", num_gpus=8, tenant="llm"))


@pytest.fixture
def clients(anon_client, outsider_client, viewer_client, other_client, operator_client):
    return {
        ANON: anon_client,
        OUTSIDER: outsider_client,
        VIEWER: viewer_client,
        OTHER: other_client,
        OPERATOR: operator_client,
    }


def _node_id() -> int:
    return Node.objects.order_by("id").values_list("id", flat=True)[1]


# (method, path template, body, {persona: expected status}).
# OTHER is a submitter of tenant "vision"; llm_job belongs to tenant "llm".
MATRIX = [
    ("get", "/api/jobs/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/jobs/{job}/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 404, OPERATOR: 200}),
    (
        "post",
        "/api/jobs/",
        {"name": "x", "num_gpus": 4, "tenant": "vision"},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 201, OPERATOR: 201},
    ),
    (
        "post",
        "/api/jobs/{job}/cancel/",
        None,
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 404, OPERATOR: 200},
    ),
    (
        "get",
        "/api/jobs/{job}/logs/",
        None,
        {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 404, OPERATOR: 200},
    ),
    ("get", "/api/racks/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/racks/{rack}/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    (
        "get",
        "/api/racks/{rack}/signals/",
        None,
        {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200},
    ),
    ("get", "/api/nodes/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/nodes/{node}/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    (
        "get",
        "/api/nodes/{node}/signals/",
        None,
        {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200},
    ),
    ("get", "/api/health-rules/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    (
        "post",
        "/api/health-rules/",
        {"name": "hot", "signal": "temperature_c", "test": "above", "threshold": 90, "verdict": "suspect"},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 201},
    ),
    (
        "post",
        "/api/nodes/{node}/drain/",
        {"reason": "maintenance"},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 200},
    ),
    (
        "post",
        "/api/nodes/{node}/undrain/",
        {},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 409},
    ),
    (
        "post",
        "/api/nodes/{node}/mark-failed/",
        {"reason": "XID 79"},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 200},
    ),
    (
        "post",
        "/api/nodes/{node}/return-to-service/",
        {},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 409},
    ),
    ("get", "/api/fleet/summary/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/audit/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/tenants/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/tenants/llm/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    (
        "put",
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 64}]},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 200},
    ),
    (
        "patch",
        "/api/tenants/llm/",
        {"weight": 2},
        {ANON: 401, OUTSIDER: 403, VIEWER: 403, OTHER: 403, OPERATOR: 200},
    ),
    ("get", "/api/me/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/schema/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
    ("get", "/api/docs/", None, {ANON: 401, OUTSIDER: 403, VIEWER: 200, OTHER: 200, OPERATOR: 200}),
]

CASES = [
    pytest.param(method, path, body, persona, code, id=f"{persona}-{method}-{path}")
    for method, path, body, codes in MATRIX
    for persona, code in codes.items()
]


@pytest.mark.parametrize(("method", "path", "body", "persona", "expected"), CASES)
def test_each_persona_gets_the_status_its_role_allows(
    clients, llm_job, fleet, other_submitter, method, path, body, persona, expected
):
    url = path.format(job=llm_job.pk, rack=fleet[0].pk, node=_node_id())
    response = getattr(clients[persona], method)(url, body, format="json")
    assert response.status_code == expected, (url, persona, response.content[:300])


def test_a_refused_write_changes_nothing(clients, llm_job):
    for persona in (ANON, OUTSIDER, VIEWER, OTHER):
        clients[persona].post(f"/api/jobs/{llm_job.pk}/cancel/")
        clients[persona].post(f"/api/nodes/{_node_id()}/drain/")
    llm_job.refresh_from_db()
    assert llm_job.state == "pending"
    assert Node.objects.get(pk=_node_id()).state == "healthy"


def test_the_submitter_of_the_jobs_tenant_may_cancel_it(submitter_client, llm_job):
    response = submitter_client.post(f"/api/jobs/{llm_job.pk}/cancel/")
    assert response.status_code == 200
    assert Job.objects.get(pk=llm_job.pk).state == "cancelled"


def test_a_submitter_lists_only_its_tenants_jobs(other_client, submitter_client, llm_job):
    assert other_client.get("/api/jobs/").json()["count"] == 0
    assert [j["id"] for j in submitter_client.get("/api/jobs/").json()["results"]] == [llm_job.pk]


def test_an_api_token_authenticates(fleet, operator):
    from rest_framework.test import APIClient

    from fleet.services.users import ensure_user

    _, token = ensure_user(None, operator.username, role="operator")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/me/").json()["role"] == "operator"
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert client.get("/api/me/").status_code == 401
