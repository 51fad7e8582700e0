"""The console's filters on a first visit (issue #10, items 15 and 16)."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.moves import drain_node


@pytest.fixture
def browser(db):
    return Client()


def _submit(actor, name: str, tenant: str):
    return submit_job(actor, JobSpec(name=name, num_gpus=1, tenant=tenant))


def test_the_audit_page_lists_events_on_its_first_visit_without_a_filter(browser, fleet, operator, viewer):
    node = fleet[0].nodes.order_by("slot").first()
    drain_node(operator, node.pk, "maintenance")
    browser.force_login(viewer)
    page = browser.get("/audit/").content.decode()
    assert "Nothing matches" not in page
    assert "node.drain" in page


def test_the_audit_page_still_refuses_a_bad_filter(browser, fleet, viewer):
    browser.force_login(viewer)
    page = browser.get("/audit/?since=yesterday").content.decode()
    assert "Nothing matches" in page or "Enter a valid date" in page


@pytest.mark.parametrize("path", ["/", "/jobs/"])
def test_the_tenant_filter_lists_each_tenant_once(browser, fleet, submitter, other_submitter, viewer, path):
    for i in range(5):
        _submit(submitter, f"llm-{i}", "llm")
    for i in range(3):
        _submit(other_submitter, f"vision-{i}", "vision")
    browser.force_login(viewer)
    page = browser.get(path).content.decode()
    assert page.count("<option>llm</option>") + page.count("<option >llm</option>") == 1
    assert page.count("vision</option>") == 1


def test_a_submitter_is_offered_only_its_own_tenants(browser, fleet, submitter, other_submitter):
    _submit(submitter, "mine", "llm")
    _submit(other_submitter, "theirs", "vision")
    browser.force_login(submitter)
    page = browser.get("/jobs/").content.decode()
    assert "llm</option>" in page
    assert "vision</option>" not in page
