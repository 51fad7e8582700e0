"""An engineer submits a job through the console's form: a refused field's
message (the API's own) appears next to that field, the what-if answer says
what would happen now, the submission lands on the job's page, and the job is
cancelled from there. No worker runs, so the job stays pending until cancelled."""

from __future__ import annotations

import re

import pytest

from fleet.models import Job
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.browser.helpers import log_in_as, open_live, post_api

pytestmark = pytest.mark.browser

GANG = {
    "name": "train-16",
    "tenant": "llm",
    "num_nodes": "16",
    "gpus_per_node": "4",
    "locality": "required",
    "preemptible": True,
}


def test_an_engineer_submits_through_the_form_sees_the_what_if_and_cancels_from_the_job_page(
    page, fleet, submitter
):
    log_in_as(page, submitter)
    page.goto("/jobs/")
    page.get_by_test_id("submit-link").click()
    page.wait_for_function("document.body.dataset.ready === '1'")
    form = page.get_by_test_id("submit-form")
    what_if = form.get_by_test_id("what-if")

    form.get_by_test_id("field-name").fill(GANG["name"])
    form.get_by_test_id("shape-nodes").check()
    # Only the chosen shape's fields show (a .field's display once beat [hidden]).
    assert form.get_by_test_id("field-num_gpus").is_hidden()
    form.get_by_test_id("field-num_nodes").fill("16")
    # A segment that does not divide the job: the API's message, next to the field.
    form.get_by_test_id("field-segment_nodes").fill("7")
    status, refused = post_api(page, "/api/jobs/what-if/", GANG | {"segment_nodes": "7"})
    assert status == 400 and list(refused) == ["segment_nodes"]
    expected = " ".join(refused["segment_nodes"])
    segment_error = form.get_by_test_id("error-segment_nodes")
    page.wait_for_function(
        "t => document.querySelector('[data-testid=error-segment_nodes]').textContent === t", arg=expected
    )
    assert what_if.get_attribute("data-state") == "refused"
    assert form.get_by_test_id("error-num_nodes").text_content() == ""

    # Segments of 8: the what-if answers where it would start now.
    form.get_by_test_id("field-segment_nodes").fill("8")
    page.wait_for_function(
        "document.querySelector('[data-testid=what-if]').dataset.state === 'answered'"
        " && document.querySelector('[data-testid=error-segment_nodes]').textContent === ''"
    )
    status, answer = post_api(page, "/api/jobs/what-if/", GANG | {"segment_nodes": "8"})
    assert status == 200 and answer["starts_now"]
    shown = what_if.get_by_test_id("what-if-summary").text_content()
    assert shown == answer["summary"] and "16 of 18 nodes" in shown
    assert Job.objects.count() == 0  # a what-if submits nothing
    assert segment_error.text_content() == ""

    form.get_by_test_id("submit").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get()
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert (job.name, job.num_nodes, job.segment_nodes, job.owner) == ("train-16", 16, 8, submitter)
    open_live(page, f"/jobs/{job.pk}/")
    assert page.get_by_test_id("job-state").text_content() == "pending"
    assert page.locator("[data-time=started]").text_content() == "not yet"

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("job-cancel").click()
    page.wait_for_function("document.querySelector('[data-testid=job-state]').textContent === 'cancelled'")
    assert page.get_by_test_id("job-cancel").is_hidden()
    assert page.get_by_test_id("cancel-error").text_content() == ""
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert page.js_errors == []


def test_the_what_if_says_at_once_why_a_job_too_big_for_a_rack_would_be_refused(page, fleet, submitter):
    """#28 item 7: a refused 40-node job showed nothing until Check was pressed
    (the refusal is about locality, a field the engineer had not touched)."""
    log_in_as(page, submitter)
    page.goto("/jobs/submit/")
    page.wait_for_function("document.body.dataset.ready === '1'")
    form = page.get_by_test_id("submit-form")
    form.get_by_test_id("field-name").fill("huge")
    form.get_by_test_id("shape-nodes").check()
    form.get_by_test_id("field-num_nodes").fill("30")
    form.get_by_test_id("field-gpus_per_node").fill("4")
    page.wait_for_function(
        "document.querySelector('[data-testid=what-if]').dataset.state === 'refused'"
        " && document.querySelector('[data-testid=what-if-summary]')"
        ".textContent.startsWith('would be refused')"
    )
    assert "exceed the largest domain (18 nodes" in form.get_by_test_id("what-if-summary").text_content()
    assert page.js_errors == []


def test_an_operator_cancels_a_job_from_its_row_in_the_jobs_list(page, fleet, operator, submitter):
    job = submit_job(submitter, JobSpec(name="eval", num_gpus=2, tenant="llm"))
    log_in_as(page, operator)
    open_live(page, "/jobs/")
    row = page.locator(f"tr[data-job-id='{job.pk}']")

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_test_id("job-cancel").click()
    page.wait_for_function(
        f"document.querySelector('[data-job-state=\"{job.pk}\"]').textContent === 'cancelled'"
    )
    assert row.get_by_test_id("job-cancel").is_hidden()
    assert "stale" in row.get_attribute("class")  # no longer queued or running: dimmed in place
    job.refresh_from_db()
    assert job.state == "cancelled" and job.state_reason == "cancelled by olga"
    assert page.js_errors == []
