"""Webhooks for reclaims: ``reclaim.proposed`` when a job is to start by
preempting borrowed work, ``reclaim.finished`` when that plan ends, each with
the job, its tenant, the victims and the GPU-hours, signed like every event."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState, WebhookEvent
from fleet.models import Action, Job, WebhookDelivery
from fleet.services.actions import propose as action_services
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs import submit as job_services
from fleet.services.tenants import quotas
from tests.support import carry_out
from tests.webhook_receiver import deliver_all, subscribe

pytestmark = pytest.mark.django_db


def _submit(user, tenant: str, name: str, nodes: int, **kw) -> Job:
    spec = job_services.JobSpec(name=name, tenant=tenant, num_nodes=nodes, gpus_per_node=4, **kw)
    return job_services.submit_job(user, spec)


@pytest.fixture
def borrowed(fleet, operator, submitter, other_submitter, receiver):
    """llm and vision have 64 GPUs of quota each; vision borrows the whole idle
    fleet (eight 4-node jobs), then llm submits a 16-node gang within its quota.
    An endpoint subscribes to both reclaim events."""
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    endpoint = subscribe(operator, receiver, WebhookEvent.RECLAIM_PROPOSED, WebhookEvent.RECLAIM_FINISHED)
    jobs = [_submit(other_submitter, "vision", f"v{i}", 4) for i in range(8)]
    schedule_pass()
    placing = Action.objects.filter(state__in=(ActionState.APPROVED, ActionState.EXECUTING))
    for action_id in placing.values_list("pk", flat=True):
        carry_out(action_id)
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {JobState.RUNNING}
    gang = _submit(submitter, "llm", "gang", 16, locality="required")
    return endpoint, gang


def _data(event_type: str) -> dict:
    (delivery,) = WebhookDelivery.objects.filter(event_type=event_type)
    assert delivery.payload["type"] == event_type
    return delivery.payload["data"]


def test_a_reclaim_is_announced_when_proposed_and_when_done(borrowed, receiver):
    endpoint, gang = borrowed
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    victims = sorted(s["job"] for s in action.steps if s["op"] == "preempt")

    proposed = _data("reclaim.proposed")
    assert proposed["job"]["id"] == gang.pk and proposed["job"]["name"] == "gang"
    assert proposed["tenant"] == "llm"
    assert sorted(v["id"] for v in proposed["victims"]) == victims
    assert {v["tenant"] for v in proposed["victims"]} == {"vision"}
    assert proposed["borrowed"] is True
    assert proposed["gpu_hours"] == action.cost_gpu_hours and proposed["lost_gpu_hours"] is None
    assert proposed["action"]["id"] == action.pk and proposed["action"]["kind"] == "reclaim"
    assert not WebhookDelivery.objects.filter(event_type="reclaim.finished").exists()

    carry_out(action.pk)
    action.refresh_from_db()
    finished = _data("reclaim.finished")
    assert finished["action"]["state"] == ActionState.SUCCEEDED
    assert finished["job"]["id"] == gang.pk and finished["job"]["state"] == JobState.RUNNING
    assert {v["state"] for v in finished["victims"]} == {JobState.PENDING}
    assert finished["lost_gpu_hours"] == action.lost_gpu_hours is not None
    assert set(WebhookDelivery.objects.values_list("endpoint", flat=True)) == {endpoint.pk}

    assert deliver_all() == ["succeeded", "succeeded"]
    assert [(r["event"], r["valid"]) for r in receiver.requests] == [
        ("reclaim.proposed", True),
        ("reclaim.finished", True),
    ]


def test_a_rejected_reclaim_is_announced_as_finished(borrowed, operator, settings):
    settings.RACKWISE_RECLAIM_APPROVAL_GPU_HOURS = 0  # every reclaim waits for an operator
    _, gang = borrowed
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    assert action.state == ActionState.PROPOSED
    assert _data("reclaim.proposed")["action"]["state"] == ActionState.PROPOSED

    action_services.reject(operator, action.pk, note="not now")

    finished = _data("reclaim.finished")
    assert finished["action"]["state"] == ActionState.REJECTED
    assert finished["action"]["decision_note"] == "not now"
    assert finished["job"]["id"] == gang.pk and finished["tenant"] == "llm"
    assert {v["state"] for v in finished["victims"]} == {JobState.RUNNING}
