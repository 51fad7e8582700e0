"""The Fleet page's chart data: each sample carries queue depth and the pending
jobs' wait percentiles; node failures and defrags come as markers."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet.choices import ActionKind, ActionState
from fleet.models import Action, FleetSample, Job
from fleet.services.actions import propose as action_services
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from fleet.services.read.metrics import percentile, record_sample


def test_percentile_is_the_nearest_rank():
    values = list(range(1, 101))
    assert [percentile(values, q) for q in (50, 95, 100)] == [50, 95, 100]
    assert percentile([], 95) == 0.0 and percentile([7.0], 50) == 7.0


def test_a_sample_holds_the_queue_and_its_waits(fleet, submitter):
    now = timezone.now()
    for minutes in (10, 20, 30, 600):
        job = submit_job(submitter, JobSpec(name=f"w{minutes}", num_nodes=18, gpus_per_node=4, tenant="llm"))
        Job.objects.filter(pk=job.pk).update(submitted_at=now - timedelta(minutes=minutes))

    sample = record_sample()

    assert sample.jobs_pending == 4
    assert 19 * 60 <= sample.wait_p50_s <= 21 * 60
    assert 599 * 60 <= sample.wait_p95_s <= 601 * 60


def test_the_samples_api_marks_failures_and_defrags(fleet, operator, viewer_client):
    node = fleet[0].nodes.order_by("slot").first()
    node_services.mark_node_failed(operator, node.pk, reason="XID 79")
    plan = action_services.propose(
        kind=ActionKind.DEFRAG,
        title="defrag",
        jobs=[],
        steps=[{"op": "drain", "node": node.pk, "hostname": node.hostname, "reason": "r"}],
    )
    Action.objects.filter(pk=plan.pk).update(state=ActionState.EXECUTING, started_at=timezone.now())
    FleetSample.objects.create(
        utilization=0.5, fragmentation=0.1, jobs_pending=3, wait_p50_s=60, wait_p95_s=600
    )

    body = viewer_client.get("/api/console/samples/", {"hours": 1}).json()

    assert body["samples"][-1] | {"at": None} == {
        "at": None,
        "utilization": 0.5,
        "fragmentation": 0.1,
        "gpus_used": 0,
        "jobs_pending": 3,
        "wait_p50_s": 60.0,
        "wait_p95_s": 600.0,
    }
    kinds = {m["kind"]: m for m in body["markers"]}
    assert kinds["failure"]["text"] == f"{node.hostname} failed: XID 79"
    assert kinds["defrag"]["text"] == f"defrag #{plan.pk} (executing)"
    assert kinds["defrag"]["url"] == f"/actions/?state=all#action-{plan.pk}"
