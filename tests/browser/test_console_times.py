"""Times in the console are the viewer's (#28 item 3): a viewer in New York
reads a job's times, the jobs list and the audit log in New York time, with
the zone named."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from fleet.models import Job
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.browser.helpers import in_thread, log_in_as

pytestmark = pytest.mark.browser


@pytest.fixture
def new_york(chromium, server):
    context = chromium.new_context(
        base_url=server.url, timezone_id="America/New_York", locale="en-US", bypass_csp=True
    )
    page = context.new_page()
    page.base_url = server.url
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    yield page
    context.close()


def test_a_viewer_reads_times_in_their_own_zone_named(new_york, fleet, submitter):
    job = in_thread(submit_job, submitter, JobSpec(name="tz", num_gpus=1, tenant="llm"))
    submitted = datetime(2026, 1, 15, 14, 30, 5, tzinfo=UTC)
    in_thread(lambda: Job.objects.filter(pk=job.pk).update(submitted_at=submitted))
    log_in_as(new_york, submitter)

    new_york.goto(f"/jobs/{job.pk}/")
    cell = new_york.locator("[data-time=submitted]")
    new_york.wait_for_function("!document.querySelector('[data-time=submitted]').textContent.includes('UTC')")
    local = submitted.astimezone(ZoneInfo("America/New_York"))
    assert cell.text_content() == local.strftime("%Y-%m-%d %H:%M:%S") + " EST"

    new_york.goto("/jobs/")
    row_time = new_york.locator(f"[data-job-id='{job.pk}'] time[data-when]")
    assert row_time.text_content() == local.strftime("%Y-%m-%d %H:%M") + " EST"
    # The audit log's times too (now, so daylight time or not).
    new_york.goto("/audit/")
    stamp = new_york.locator("[data-testid=audit-row] time[data-when]").first
    assert stamp.text_content().endswith((" EST", " EDT")), stamp.text_content()
    assert new_york.js_errors == []


def test_the_charts_read_in_the_viewers_zone_and_no_axis_repeats_a_label(new_york, fleet, viewer):
    """Chart axes read "1, 1, 0" for a queue of at most one job, and their times
    were UTC without saying so (#28 items 3 and 8)."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import FleetSample

    now = timezone.now()
    in_thread(
        lambda: FleetSample.objects.bulk_create(
            FleetSample(
                at=now - timedelta(minutes=m),
                utilization=0.5,
                fragmentation=0.1,
                jobs_pending=m % 2,
                wait_p50_s=60 + m,
                wait_p95_s=90 + m,
            )
            for m in range(30)
        )
    )
    log_in_as(new_york, viewer)
    new_york.goto("/")
    new_york.wait_for_selector("[data-chart=queue] text.axis")
    for chart in ("use", "queue", "wait"):
        labels = new_york.locator(f"[data-chart={chart}] text.axis").all_text_contents()
        values, times = labels[:-2], labels[-2:]
        assert len(values) == len(set(values)), f"{chart}: {values}"
        assert all(t.endswith((" EST", " EDT")) for t in times), times
    assert new_york.locator("[data-chart=queue] text.axis").all_text_contents()[:-2] == ["0", "1", "2"]
    assert new_york.js_errors == []
