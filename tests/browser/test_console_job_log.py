"""The job page shows the job's log (#32): its last lines at once, then the
lines written since, read by offset every few seconds while the job runs, and
no more reads once it has ended (static/rackwise/joblog.js). The app server's
simulated cluster runs a job's expected second in a hundredth of a second
(tests/support.py FAST_CLUSTER)."""

from __future__ import annotations

import pytest

from fleet.models import Node
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.browser.helpers import in_thread, log_in_as

pytestmark = pytest.mark.browser


def start(job):
    node = Node.objects.filter(rack__name="r1").order_by("hostname").first()
    job_allocations.apply_placement(None, job.pk, {node.id: [0, 1, 2, 3]}, reason="test")
    return job_allocations.start_job(None, job.pk)


def test_the_job_page_follows_the_log_while_the_job_runs_and_stops_at_its_end(page, fleet, submitter):
    spec = JobSpec(
        name="page-log",
        num_gpus=4,
        tenant="llm",
        expected_duration_s=400,  # 4 s here: a progress line every 0.4 s
        checkpoint_interval_s=100_000,
        slurm={"command": "python train.py --api-key abcdef123456"},
    )
    job = in_thread(submit_job, submitter, spec)
    log_in_as(page, submitter)
    page.goto(f"/jobs/{job.pk}/")
    status = page.locator("[data-testid=job-log-status]")
    page.wait_for_function(
        "document.querySelector('[data-testid=job-log-status]').textContent.includes('not started')"
    )
    assert page.locator("[data-testid=job-log]").is_hidden()

    in_thread(start, job)
    log = page.locator("[data-testid=job-log]")
    page.wait_for_function(
        "document.querySelector('[data-testid=job-log]').textContent.includes('step 300: 30%')", timeout=20000
    )
    assert "following while the job runs" in status.text_content()
    assert "--api-key [redacted]" in log.text_content() and "abcdef123456" not in log.text_content()

    in_thread(job_allocations.finish_job, None, job.pk, succeeded=True, reason="done")
    page.wait_for_function(
        "document.querySelector('[data-testid=job-log]').dataset.eof === '1'", timeout=20000
    )
    text = log.text_content().splitlines()
    assert text[-1].endswith(f"job #{job.pk} completed: done")
    assert len(text) == len(set(text))  # each line once
    assert "the job has ended" in status.text_content()
    assert page.js_errors == []
