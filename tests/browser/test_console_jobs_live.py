"""The Jobs list and the Job page follow the live feed: states change in place, new
matching jobs are announced (not inserted), and the job page shows the racks the
job holds now. Jobs are placed by the services from the test (no worker, so
nothing else places them)."""

from __future__ import annotations

import pytest

from fleet.models import Node
from fleet.services.jobs.allocations import apply_placement, requeue_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.browser.helpers import in_thread, log_in_as, open_live

pytestmark = pytest.mark.browser


def _spec(name: str) -> JobSpec:
    return JobSpec(name=name, num_nodes=2, gpus_per_node=4, tenant="llm", expected_duration_s=10**6)


def _two_nodes(rack) -> dict[int, list[int]]:
    return {n.pk: [0, 1, 2, 3] for n in Node.objects.filter(rack=rack).order_by("slot")[:2]}


def test_the_jobs_list_shows_a_job_placed_and_announces_a_new_pending_one_live(
    page, fleet, operator, submitter
):
    job = submit_job(submitter, _spec("train-a"))
    other = submit_job(submitter, _spec("eval-b"))  # fails the search: its events must not count
    log_in_as(page, operator)
    open_live(page, "/jobs/?state=pending&q=train")
    row = page.locator(f"tr[data-job-id='{job.pk}']")
    assert row.locator("[data-job-state]").text_content() == "pending"

    in_thread(apply_placement, None, job.pk, _two_nodes(fleet[0]), reason="placed by the test")
    page.wait_for_function(
        f"document.querySelector('[data-job-state=\"{job.pk}\"]').textContent === 'placed'"
    )
    # No longer pending: dimmed where it is, not removed.
    assert "stale" in row.get_attribute("class") and "placed" in row.locator(".badge").get_attribute("class")
    assert page.locator("[data-testid=new-jobs]").is_hidden()

    in_thread(apply_placement, None, other.pk, _two_nodes(fleet[1]), reason="placed by the test")
    new = in_thread(submit_job, submitter, _spec("train-c"))
    page.wait_for_function("window.rackwise.jobsApplied >= 3")
    banner = page.locator("[data-testid=new-jobs]")
    banner.wait_for(state="visible")
    assert banner.get_attribute("data-count") == "1" and "1 new job matches" in banner.text_content()
    assert page.locator(f"tr[data-job-id='{new.pk}']").count() == 0  # announced, not inserted

    banner.locator("a").click()
    page.wait_for_selector(f"tr[data-job-id='{new.pk}']")
    assert page.locator(f"tr[data-job-id='{job.pk}']").count() == 0  # the server's filter now
    assert page.js_errors == []


def test_the_job_page_draws_the_rack_the_job_is_placed_on_and_follows_it_when_it_moves(
    page, fleet, operator, submitter
):
    r1, r2 = fleet
    job = submit_job(submitter, _spec("train"))
    log_in_as(page, operator)
    open_live(page, f"/jobs/{job.pk}/")
    assert page.locator("[data-testid=no-racks]").is_visible()
    assert page.locator("[data-live-rack]").count() == 0

    in_thread(apply_placement, None, job.pk, _two_nodes(r1), reason="placed by the test")
    in_thread(start_job, None, job.pk)
    page.wait_for_function(
        "([s, job]) => window.rackwiseGrid.cells(s).filter(c => c.fill === job).length === 8",
        arg=[f"[data-live-rack][data-rack-id='{r1.pk}']", job.pk],
    )
    page.wait_for_function("document.querySelector('[data-testid=job-state]').textContent === 'running'")
    assert page.locator("[data-testid=no-racks]").is_hidden()
    # The export panel, absent while the job waited, now hands over r1's nodes.
    page.wait_for_function(
        "document.querySelector('[data-testid=export-slurm]').textContent.includes('--nodelist=r1-')"
    )
    assert page.locator("[data-testid=export-panel]").is_visible()

    # Moved: requeued off r1, then placed on r2. The page shows r2 and only r2.
    in_thread(requeue_job, None, job.pk, reason="moved by the test")
    page.wait_for_function("document.querySelectorAll('[data-live-rack]').length === 0")
    assert page.locator("[data-testid=no-racks]").is_visible()
    page.wait_for_function("document.querySelector('[data-testid=export-panel]').hidden")
    assert "moved by the test" in page.locator("[data-testid=waiting]").text_content()

    in_thread(apply_placement, None, job.pk, _two_nodes(r2), reason="placed by the test")
    page.wait_for_function(
        "([s, job]) => window.rackwiseGrid.cells(s).filter(c => c.fill === job).length === 8",
        arg=[f"[data-live-rack][data-rack-id='{r2.pk}']", job.pk],
    )
    assert page.locator("[data-live-rack]").count() == 1
    assert page.locator("[data-testid=job-state]").text_content() == "placed"
    page.wait_for_function(
        "document.querySelector('[data-testid=export-slurm]').textContent.includes('--nodelist=r2-')"
    )
    assert "r1-" not in page.locator("[data-testid=export-kubernetes]").text_content()
    assert page.js_errors == []
