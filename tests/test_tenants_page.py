"""The Tenants page (/tenants/): every role reads each tenant's quota, usage,
borrowing, lending, pending demand, fair share and decayed usage as bars;
operators alone get the forms that edit them through /api/tenants/. The browser
side (saving, messages in place): tests/browser/test_console_tenants.py."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from fleet.models import AuditEvent, Node, Quota, Tenant
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.tenants.quotas import set_quotas

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(fleet, operator, submitter, other_submitter):
    """llm has 64 GPUs of quota and holds 8 on rack r1; vision has no quota and
    waits for 16."""
    set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 64, "borrowing_limit_gpus": 32}])
    job = submit_job(submitter, JobSpec(name="train", num_nodes=2, gpus_per_node=4, tenant="llm"))
    nodes = Node.objects.filter(rack=fleet[0], slot__in=[0, 1])
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    start_job(None, job.pk)
    submit_job(other_submitter, JobSpec(name="wait", num_nodes=4, gpus_per_node=4, tenant="vision"))
    return fleet


def _page(user) -> tuple[int, str]:
    client = Client()
    client.force_login(user)
    response = client.get("/tenants/")
    return response.status_code, response.content.decode()


def _tenant(html: str, name: str) -> str:
    match = re.search(rf'<article[^>]*data-tenant="{name}".*?</article>', html, re.S)
    assert match, f"no {name} on the page"
    return match.group(0)


def _figure(html: str, testid: str) -> str:
    match = re.search(rf'data-testid="{testid}">([^<]*)<', html)
    assert match, f"no {testid}"
    return match.group(1)


@pytest.mark.parametrize("persona", ["viewer", "submitter", "operator"])
def test_every_role_reads_the_figures_as_bars(shared, request, persona):
    status, html = _page(request.getfixturevalue(persona))
    assert status == 200
    llm, vision = _tenant(html, "llm"), _tenant(html, "vision")
    assert [_figure(llm, k) for k in ("nominal", "in-use", "borrowed", "lent")] == ["64", "8", "0", "0"]
    # Drawn against the cohort's 128 GPUs (144 less the spare nodes).
    assert "cohort 128 GPUs" in llm
    assert 'class="fill nominal" style="width:50.0%"' in llm
    assert 'class="fill in-use" style="width:6.2%"' in llm
    assert _figure(vision, "pending") == "16" and _figure(llm, "pending") == "0"
    # vision has no quota and holds nothing, but its waiting job is shown in its shape.
    assert [_figure(vision, k) for k in ("nominal", "in-use", "shape-pending")] == ["0", "0", "16"]
    assert _figure(llm, "shape-pending") == "0"
    assert _figure(llm, "fair-share") == "0.5"  # two tenants, equal weights
    assert float(_figure(llm, "decayed-usage")) >= 0
    assert "borrows at most 32; lends all of it" in llm
    assert 'data-testid="nav-tenants"' in html


def test_only_operators_get_the_edit_forms_and_their_script(shared, viewer, submitter, operator):
    for user in (viewer, submitter):
        html = _page(user)[1]
        assert 'data-testid="tenant-edit"' not in html and "<input" not in html.split("<main>")[1]
        assert "tenants.js" not in html
    html = _page(operator)[1]
    llm = _tenant(html, "llm")
    assert 'data-testid="quota-form"' in llm and 'data-testid="share-form"' in llm
    assert "tenants.js" in html
    # The form starts from the tenant's quota; a tenant without one starts blank.
    assert re.search(r'name="nominal_gpus" value="64"', llm)
    assert re.search(r'name="borrowing_limit_gpus" value="32"', llm)
    assert re.search(r'name="nominal_gpus" value=""', _tenant(html, "vision"))


def test_an_outsider_is_refused_and_an_anonymous_visitor_sent_to_log_in(shared, outsider):
    assert _page(outsider)[0] == 403
    response = Client().get("/tenants/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


@pytest.mark.parametrize("persona", ["viewer_client", "submitter_client"])
def test_a_direct_write_from_a_viewer_or_submitter_is_refused_and_changes_nothing(shared, request, persona):
    client = request.getfixturevalue(persona)
    put = client.put(
        "/api/tenants/llm/quotas/", {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 8}]}, format="json"
    )
    patch = client.patch("/api/tenants/llm/", {"weight": 5}, format="json")
    assert (put.status_code, patch.status_code) == (403, 403)
    assert list(Quota.objects.values_list("nominal_gpus", flat=True)) == [64]
    assert Tenant.objects.get(name="llm").weight == 1.0


def test_bad_input_is_a_message_for_its_field_and_writes_nothing(shared, operator, operator_client):
    html = _page(operator)[1]
    # The slots the page shows the API's messages in (named per row by tenants.js).
    assert 'data-testid="error-nominal_gpus-4"' in _tenant(html, "llm")
    assert 'data-testid="error-weight"' in html and 'data-field-error="weight"' in html
    audited = AuditEvent.objects.count()

    too_many = operator_client.put(
        "/api/tenants/llm/quotas/", {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 500}]}, format="json"
    )
    negative = operator_client.put(
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 8, "lending_limit_gpus": -1}]},
        format="json",
    )
    weight = operator_client.patch("/api/tenants/llm/", {"weight": 0}, format="json")

    assert too_many.status_code == 400 and list(too_many.json()) == ["quotas[0].nominal_gpus"]
    assert negative.status_code == 400 and list(negative.json()) == ["quotas[0].lending_limit_gpus"]
    assert weight.status_code == 400 and list(weight.json()) == ["weight"]
    assert list(Quota.objects.values_list("nominal_gpus", "borrowing_limit_gpus")) == [(64, 32)]
    assert Tenant.objects.get(name="llm").weight == 1.0
    assert AuditEvent.objects.count() == audited


def test_an_operators_save_shows_on_the_page(shared, operator, operator_client):
    response = operator_client.put(
        "/api/tenants/vision/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 40, "lending_limit_gpus": 8}]},
        format="json",
    )
    assert response.status_code == 200
    vision = _tenant(_page(operator)[1], "vision")
    assert _figure(vision, "nominal") == "40"
    assert "borrows without limit; lends at most 8" in vision
