"""A shared fleet end to end, as its users drive it: quotas set through the
API, jobs submitted through the API, and real Celery workers that schedule,
reclaim and carry out the steps on the simulated cluster."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Job, Node
from tests.support import consistent_violations, nodes_of, wait_for, workers

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(client, tenant: str, name: str, nodes: int, **extra) -> int:
    response = client.post(
        "/api/jobs/",
        {
            "name": name,
            "tenant": tenant,
            "num_nodes": nodes,
            "gpus_per_node": 4,
            "expected_duration_s": 10**6,
            **extra,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _racks(job_id: int) -> set[int]:
    return set(Node.objects.filter(pk__in=nodes_of(job_id)).values_list("rack_id", flat=True))


def test_a_tenant_under_its_quota_takes_back_one_rack_from_a_borrower_with_real_workers(
    fleet, operator_client, submitter_client, other_client
):
    for tenant in ("llm", "vision"):
        response = operator_client.put(
            f"/api/tenants/{tenant}/quotas/",
            {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 64}]},
            format="json",
        )
        assert response.status_code == 200, response.content

    with workers(1):
        # vision borrows the whole idle fleet: eight 4-node jobs, 128 GPUs of its 64.
        borrowed = [_submit(other_client, "vision", f"v{i}", 4) for i in range(8)]
        wait_for(
            lambda: Job.objects.filter(pk__in=borrowed, state=JobState.RUNNING).count() == 8,
            40,
            "vision's jobs to run",
        )
        vision = other_client.get("/api/tenants/vision/").json()
        assert vision["quotas"][0]["borrowed_gpus"] == 64, vision

        gang = _submit(submitter_client, "llm", "gang", 16, locality="required")
        action = wait_for(
            lambda: Action.objects.filter(kind=ActionKind.RECLAIM, jobs=gang).first(), 30, "a reclaim"
        )
        # The pass that saw the gang proposed the reclaim: no placement was tried first.
        assert list(Action.objects.filter(jobs=gang).values_list("kind", flat=True)) == [ActionKind.RECLAIM]
        victims = sorted(s["job"] for s in action.steps if s["op"] == "preempt")
        assert len(victims) == 4, "one rack's worth of borrowed work, no more"
        assert {_racks(v).pop() for v in victims} == {_racks(victims[0]).pop()}
        rack = _racks(victims[0]).pop()

        wait_for(lambda: Job.objects.get(pk=gang).state == JobState.RUNNING, 40, "the gang to run")
        wait_for(
            lambda: Action.objects.get(pk=action.pk).state == ActionState.SUCCEEDED, 20, "the reclaim to end"
        )
        assert _racks(gang) == {rack}, "the gang runs rack-local, in the rack taken back"
        for job in Job.objects.filter(pk__in=victims):
            assert job.state == JobState.PENDING, job.state
            # Why it waits: the reclaim, or (once a pass has seen it) its tenant's quota.
            assert (
                job.state_reason
                == f"preempted by action #{action.pk} (reclaim) to start job #{gang} gang (llm)"
                or (job.state_reason.startswith("quota: vision holds 64 of 64 nominal GPUs"))
            ), job.state_reason
        untouched = set(borrowed) - set(victims)
        assert Job.objects.filter(pk__in=untouched, state=JobState.RUNNING).count() == 4

    detail = other_client.get(f"/api/jobs/{victims[0]}/").json()
    assert (
        detail["state"] == "pending" and detail["state_reason"] == Job.objects.get(pk=victims[0]).state_reason
    )
    assert consistent_violations() == []
