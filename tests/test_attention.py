"""What needs a person: GET /api/attention/, the nav badge on every page, and the
Fleet page's banner and totals; each persona counts only what it may see."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.choices import ActionKind, JobState, NodeState
from fleet.models import Action, Job, Node
from fleet.services.actions import propose as action_services
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.read.attention import age_text
from tests.support import page_html


@pytest.fixture
def needs(fleet, submitter, other_submitter):
    """Two proposals (llm's, 40 and 5 minutes old) and one of vision's; a job of
    llm waiting 2 h, one waiting 10 min; a vision job recovering; a failed node
    and a suspect one."""
    now = timezone.now()
    llm_old = submit_job(submitter, JobSpec(name="old-wait", num_gpus=4, tenant="llm"))
    llm_new = submit_job(submitter, JobSpec(name="new-wait", num_gpus=4, tenant="llm"))
    vision = submit_job(other_submitter, JobSpec(name="vision-job", num_gpus=4, tenant="vision"))
    Job.objects.filter(pk=llm_old.pk).update(submitted_at=now - timedelta(hours=2))
    Job.objects.filter(pk=llm_new.pk).update(submitted_at=now - timedelta(minutes=10))
    Job.objects.filter(pk=vision.pk).update(state=JobState.RECOVERING)

    def proposal(job, minutes):
        a = action_services.propose(
            kind=ActionKind.MIGRATION,
            title=f"move #{job.pk}",
            jobs=[job.pk],
            steps=[{"op": "start", "job": job.pk}],
        )
        Action.objects.filter(pk=a.pk).update(created_at=now - timedelta(minutes=minutes))
        return a

    oldest = proposal(llm_old, 40)
    proposal(llm_new, 5)
    foreign = proposal(vision, 90)
    nodes = list(Node.objects.order_by("id")[:2])
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.FAILED)
    Node.objects.filter(pk=nodes[1].pk).update(state=NodeState.SUSPECT)
    return {"oldest": oldest, "foreign": foreign}


def test_age_text_reads_like_a_person():
    assert [age_text(s) for s in (0, 59, 60, 3599, 3600, 3660, 86400, 90000)] == [
        "0 s",
        "59 s",
        "1 min",
        "59 min",
        "1 h",
        "1 h 1 min",
        "1 d",
        "1 d 1 h",
    ]


def test_an_operator_sees_everything_that_needs_a_person_with_links(needs, operator_client):
    body = operator_client.get("/api/attention/").json()

    approval = body["awaiting_approval"]
    assert approval["count"] == 3 and approval["oldest_id"] == needs["foreign"].pk
    assert 89 * 60 <= approval["oldest_age_s"] <= 91 * 60 and approval["oldest_age"] == "1 h 30 min"
    assert body["jobs_recovering"] == 1
    assert body["jobs_waiting_long"] == 1, "only the job past RACKWISE_WAIT_WARN_S (1 h)"
    assert body["nodes"] == {"suspect": 1, "failed": 1, "in_repair": 0}
    items = {i["key"]: i for i in body["items"]}
    assert list(items) == ["approval", "recovering", "waiting", "nodes_suspect", "nodes_failed"]
    assert items["approval"]["text"] == "3 awaiting approval, the oldest for 1 h 30 min"
    assert items["approval"]["url"] == f"/actions/?state=proposed#action-{needs['foreign'].pk}"
    assert items["waiting"]["text"].startswith("1 job waiting longer than 1 h, the longest for 2 h")
    assert items["recovering"]["url"] == "/jobs/?state=recovering"
    assert items["nodes_failed"]["url"] == "/?state=failed"


def test_a_submitter_counts_only_its_tenants_jobs_and_actions(needs, submitter_client):
    body = submitter_client.get("/api/attention/").json()

    assert body["awaiting_approval"]["count"] == 2
    assert body["awaiting_approval"]["oldest_id"] == needs["oldest"].pk
    assert body["jobs_recovering"] == 0, "vision's job is not theirs"
    assert body["nodes"]["failed"] == 1, "nodes are fleet-level, as racks are"


def test_the_wait_warning_follows_the_setting(needs, operator_client, settings):
    settings.RACKWISE_WAIT_WARN_S = 300
    assert operator_client.get("/api/attention/").json()["jobs_waiting_long"] == 2


def test_outsiders_and_anonymous_callers_are_refused(needs, outsider_client, anon_client):
    assert outsider_client.get("/api/attention/").status_code == 403
    assert anon_client.get("/api/attention/").status_code in (401, 403)


def test_the_nav_badge_counts_the_proposals_on_every_page_and_hides_at_zero(needs, viewer, submitter, fleet):
    for path in ("/", "/jobs/", "/actions/", "/audit/", "/tenants/", f"/racks/{fleet[0].pk}/"):
        assert 'data-testid="nav-badge" data-count="3"' in page_html(viewer, path), path
    assert "3 awaiting approval · oldest 1 h 30 min" in page_html(viewer, "/")
    assert 'data-count="2"' in page_html(submitter, "/")
    Action.objects.all().delete()
    badge = re.search(r'<a class="nav-badge"[^>]*>([^<]*)</a>', page_html(viewer, "/"))
    assert (
        'data-count="0"' in badge.group(0)
        and " hidden" in badge.group(0)
        and badge.group(1).strip() == "0 awaiting approval"
    )


def test_the_fleet_page_has_the_banner_and_the_totals(needs, operator):
    html = page_html(operator, "/")
    assert 'data-testid="attention-banner"' in html
    assert "1 job recovering from a failure" in html
    assert f'href="/actions/?state=proposed#action-{needs["foreign"].pk}"' in html
    assert 'data-attention-total="recovering">1<' in html
    assert 'data-attention-total="waiting">1<' in html
    assert (
        'data-attention-total="nodes_failed">1<' in html and 'data-attention-total="nodes_suspect">1<' in html
    )
