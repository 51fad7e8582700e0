"""The Tenants page in a real browser: an operator's quota beyond the fleet is
named next to its field and writes nothing, as is one that would promise more
than the fleet has left (409, above the form); a good one is saved through
/api/tenants/ and its figure redrawn; a viewer sees the figures and no form."""

from __future__ import annotations

import pytest

from fleet.models import AuditEvent, Quota, RackReservation, Tenant
from tests.browser.helpers import log_in_as

pytestmark = pytest.mark.browser


def test_an_operator_edits_a_quota_and_a_viewer_sees_it_without_controls(
    page, fleet, operator, viewer, submitter, other_submitter
):
    log_in_as(page, operator)
    page.goto("/tenants/")
    page.wait_for_function("document.body.dataset.ready === '1'")
    llm = page.locator("article[data-tenant=llm]")
    assert llm.locator("[data-testid=no-quota]").is_visible()
    llm.locator("[data-testid=tenant-edit] summary").click()
    form = llm.locator("[data-testid=quota-form]")

    # More than the fleet has: the service's message next to the field, nothing written.
    form.locator("[data-testid=nominal_gpus-4]").fill("500")
    form.locator("[data-testid=quota-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=llm]').dataset.failed === '1'")
    message = form.locator("[data-testid=error-nominal_gpus-4]").text_content()
    assert "more than the fleet's 128 GPUs" in message
    assert form.locator("[data-testid=quota-error]").text_content() == ""
    assert not Quota.objects.exists()

    # A limit without a nominal quota: the parser's message, also in its place.
    form.locator("[data-testid=nominal_gpus-4]").fill("")
    form.locator("[data-testid=lending_limit_gpus-4]").fill("8")
    form.locator("[data-testid=quota-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=llm]').dataset.failed === '2'")
    assert form.locator("[data-testid=error-nominal_gpus-4]").text_content() != ""
    assert form.locator("[data-testid=error-lending_limit_gpus-4]").text_content() == ""

    form.locator("[data-testid=nominal_gpus-4]").fill("48")
    form.locator("[data-testid=quota-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=llm]').dataset.saved === '1'")
    assert form.locator("[data-testid=error-nominal_gpus-4]").text_content() == ""
    assert llm.locator("[data-testid=quota-row][data-shape='4'] [data-testid=nominal]").text_content() == "48"
    assert "lends at most 8" in llm.locator("[data-testid=quota-row]").text_content()
    assert list(Quota.objects.values_list("nominal_gpus", "lending_limit_gpus")) == [(48, 8)]
    assert AuditEvent.objects.filter(action="tenant.quota", actor=operator).count() == 1

    # A whole rack reserved: it must fit the nominal quota, said next to the field.
    form.locator("[data-testid=reserved_racks]").fill("r2")
    form.locator("[data-testid=quota-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=llm]').dataset.failed === '3'")
    assert "nominal quota, which is 48" in form.locator("[data-testid=error-reserved_racks]").text_content()
    form.locator("[data-testid=nominal_gpus-4]").fill("64")
    form.locator("[data-testid=quota-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=llm]').dataset.saved === '2'")
    assert llm.locator("[data-testid=reserved-racks]").text_content().strip() == "r2"
    assert RackReservation.objects.get().rack.name == "r2"

    # Nominal quotas are guarantees: vision may not be promised more than the 64 left.
    vision = page.locator("article[data-tenant=vision]")
    vision.locator("[data-testid=tenant-edit] summary").click()
    other = vision.locator("[data-testid=quota-form]")
    other.locator("[data-testid=nominal_gpus-4]").fill("65")
    other.locator("[data-testid=quota-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=vision]').dataset.failed === '1'")
    assert "give at most 64" in other.locator("[data-testid=quota-error]").text_content()
    assert not Quota.objects.filter(tenant__name="vision").exists()

    # Weight: every tenant's fair share is redrawn.
    share = llm.locator("[data-testid=share-form]")
    share.locator("[data-testid=weight]").fill("3")
    share.locator("[data-testid=share-save]").click()
    page.wait_for_function("document.querySelector('article[data-tenant=llm]').dataset.saved === '3'")
    assert llm.locator("[data-testid=fair-share]").text_content() == "0.75"
    assert page.locator("article[data-tenant=vision] [data-testid=fair-share]").text_content() == "0.25"
    assert Tenant.objects.get(name="llm").weight == 3.0
    assert page.js_errors == []

    page.context.clear_cookies()
    log_in_as(page, viewer)
    page.goto("/tenants/")
    llm = page.locator("article[data-tenant=llm]")
    assert llm.locator("[data-testid=quota-row][data-shape='4'] [data-testid=nominal]").text_content() == "64"
    assert llm.locator("[data-testid=reserved-racks]").text_content().strip() == "r2"
    assert page.locator("[data-testid=tenant-edit]").count() == 0
    assert page.locator("main input, main button").count() == 0
