"""The engineer's pages: the job submission form (submitters and operators
only), Cancel where the API would allow it, and the job page's times and the
open action that holds a job."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.choices import ActionKind
from fleet.models import Job, Node
from fleet.services.actions import propose as action_services
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job

SUBMIT = "/jobs/submit/"


def page_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def html(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_a_submitter_gets_the_form_with_its_tenants_and_no_script_field_off_slurm(fleet, submitter):
    page = html(page_for(submitter).get(SUBMIT))
    assert 'data-testid="submit-form"' in page
    assert "<option>llm</option>" in page and "vision" not in page
    for field in (
        "num_gpus",
        "num_nodes",
        "gpus_per_node",
        "segment_nodes",
        "locality",
        "priority",
        "preemptible",
        "expected_duration_s",
    ):
        assert f'name="{field}"' in page, field
    assert 'name="script"' not in page


def test_the_form_offers_the_script_when_the_cluster_is_slurm(fleet, submitter, settings):
    settings.RACKWISE_CLUSTER = "slurm"
    assert 'name="script"' in html(page_for(submitter).get(SUBMIT))


def test_an_operator_may_submit_for_any_tenant(fleet, operator, submitter, other_submitter):
    page = html(page_for(operator).get(SUBMIT))
    assert "<option>llm</option>" in page and "<option>vision</option>" in page


def test_viewers_and_outsiders_are_refused_the_form_and_see_no_submit_or_cancel(
    fleet, viewer, outsider, submitter
):
    submit_job(submitter, JobSpec(name="train", num_gpus=4, tenant="llm"))
    assert page_for(viewer).get(SUBMIT).status_code == 403
    assert page_for(outsider).get(SUBMIT).status_code == 403
    jobs = html(page_for(viewer).get("/jobs/"))
    assert 'data-testid="submit-link"' not in jobs and 'data-testid="job-cancel"' not in jobs


def test_a_submitter_s_jobs_list_links_the_form_and_offers_cancel_on_unfinished_rows(fleet, submitter):
    submit_job(submitter, JobSpec(name="train", num_gpus=4, tenant="llm"))
    jobs = html(page_for(submitter).get("/jobs/?state=all"))
    assert f'href="{SUBMIT}"' in jobs
    assert jobs.count('data-testid="job-cancel"') == 1 and 'data-testid="job-cancel" hidden' not in jobs


def test_the_job_page_shows_its_times_and_the_action_holding_it(fleet, submitter, viewer):
    job = submit_job(
        submitter,
        JobSpec(name="train", num_nodes=2, gpus_per_node=4, tenant="llm", expected_duration_s=4 * 3600),
    )
    nodes = Node.objects.filter(rack=fleet[0]).order_by("slot")[:2]
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    start_job(None, job.pk)
    now = timezone.now()
    # Back-date it: submitted 3 h ago, started 2 h ago (waited 1 h).
    Job.objects.filter(pk=job.pk).update(
        submitted_at=now - timedelta(hours=3), started_at=now - timedelta(hours=2)
    )
    held = action_services.propose(
        kind=ActionKind.MIGRATION,
        title=f"move job #{job.pk}",
        jobs=[job.pk],
        steps=[{"op": "start", "job": job.pk}],
    )
    job.refresh_from_db()

    page = html(page_for(submitter).get(f"/jobs/{job.pk}/"))

    def shown(t):  # as the server writes it; time.js then shows it in the viewer's zone
        return (
            f'<time datetime="{t.isoformat()}" data-when data-seconds>'
            f"{t.strftime('%Y-%m-%d %H:%M:%S')} UTC</time>"
        )

    assert f'data-time="submitted">{shown(job.submitted_at)}<' in page
    assert f'data-time="started">{shown(job.started_at)}<' in page
    assert 'data-time="run">2 h<' in page
    assert f'data-time="expected-end">{shown(job.started_at + timedelta(hours=4))}<' in page
    assert 'data-time="waited">1 h<' in page
    assert f"action #{held.pk}</a> (migration, proposed) since {shown(held.created_at)}" in page
    assert 'data-testid="job-cancel"' in page
    # A viewer reads the same page without the button.
    assert 'data-testid="job-cancel"' not in html(page_for(viewer).get(f"/jobs/{job.pk}/"))


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (45, "45 s"),
        (720, "12 min"),
        (3 * 3600 + 300, "3 h 5 min"),
        (2 * 86400 + 4 * 3600, "2 d 4 h"),
        (86400, "1 d"),
    ],
)
def test_durations_read_as_words(seconds, words):
    from fleet.views import span_text

    assert span_text(seconds) == words


def test_a_job_that_never_started_has_no_run_time_and_its_wait_runs_on(fleet, submitter):
    job = submit_job(submitter, JobSpec(name="wait", num_gpus=4, tenant="llm"))
    Job.objects.filter(pk=job.pk).update(submitted_at=timezone.now() - timedelta(minutes=12, seconds=5))
    page = html(page_for(submitter).get(f"/jobs/{job.pk}/"))
    assert 'data-time="started">not yet<' in page and 'data-time="run">\u2013<' in page
    assert 'data-time="expected-end">no expected duration<' in page
    assert 'data-time="waited">12 min<' in page
    assert re.search(r'data-testid="held-by"[^>]* hidden>', page)
