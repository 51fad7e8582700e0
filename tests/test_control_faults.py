"""Faults: a worker killed with SIGKILL in the middle of an action, and Redis
restarted while work is queued. After a restart and one reconcile pass, nothing
is lost, leaked or doubled."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import locks
from fleet.choices import OPEN_ACTION_STATES, ActionState, JobState
from fleet.models import Action, Allocation, Job, Node
from fleet.tasks import reconcile_once
from tests.support import (
    Worker,
    consistent_violations,
    flush_broker,
    nodes_of,
    restart_redis,
    wait_for,
    workers,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_killed_mid_action_is_replaced_and_the_action_finishes_once(
    fragmented, fleet, operator_client, settings
):
    a, _, c = fragmented
    settings.RACKWISE_STALL_S = 3
    flush_broker()
    slow = Worker({"RACKWISE_SIM_STEP_SECONDS": "1.5"}).start()
    try:
        plan = operator_client.post("/api/actions/defrag/", {}, format="json").json()
        operator_client.post(f"/api/actions/{plan['id']}/approve/", {}, format="json")
        # Kill it while it is inside a step after the first.
        wait_for(
            lambda: Action.objects.filter(
                pk=plan["id"], state=ActionState.EXECUTING, step_index__gte=1
            ).exists(),
            30,
            "the action to be under way",
        )
        slow.kill()
    finally:
        slow.stop()
    stuck = Action.objects.get(pk=plan["id"])
    assert stuck.state == ActionState.EXECUTING and stuck.step_index < len(stuck.steps)

    with workers(1):
        # The dead worker's lock lapses; then one reconcile pass hands the action on.
        wait_for(lambda: not locks.is_held(f"rackwise:lock:action:{plan['id']}"), 30, "the lock to lapse")
        # Reconcile as it would run once the action has been quiet for the stall time.
        later = timezone.now() + timedelta(seconds=settings.RACKWISE_STALL_S)
        reconciled = reconcile_once(now=later)
        assert plan["id"] in reconciled["executing"]
        wait_for(
            lambda: Action.objects.filter(pk=plan["id"], state=ActionState.SUCCEEDED).exists(),
            30,
            "the action",
        )
        wait_for(
            lambda: Job.objects.filter(pk=c.pk, state=JobState.RUNNING).exists(), 30, "the waiting job to run"
        )

    done = Action.objects.get(pk=plan["id"])
    assert [e["op"] for e in done.log if e["status"] == "done"] == ["checkpoint", "stop", "allocate", "start"]
    _, r2 = fleet
    assert {Node.objects.get(pk=n).rack_id for n in nodes_of(a.pk)} == {r2.pk}
    assert Allocation.objects.filter(job=a, released_at__isnull=True).count() == 16
    assert consistent_violations() == []


def test_jobs_queued_when_redis_restarts_are_placed_after_one_reconcile_pass(fleet, submitter_client):
    flush_broker()
    # No worker yet: the submissions' scheduling messages wait in Redis...
    ids = [
        submitter_client.post(
            "/api/jobs/",
            {
                "name": f"j{i}",
                "num_nodes": 4,
                "gpus_per_node": 4,
                "expected_duration_s": 10**6,
                "tenant": "llm",
            },
            format="json",
        ).json()["id"]
        for i in range(5)
    ]
    # ...and are lost with it.
    restart_redis()
    with workers(1):
        assert Job.objects.filter(pk__in=ids, state=JobState.PENDING).count() == 5
        reconcile_once()
        wait_for(
            lambda: Job.objects.filter(pk__in=ids, state=JobState.RUNNING).count() == 5, 30, "all five to run"
        )
        wait_for(
            lambda: not Action.objects.filter(state__in=OPEN_ACTION_STATES).exists(), 30, "actions to finish"
        )

    for job_id in ids:
        assert Allocation.objects.filter(job_id=job_id, released_at__isnull=True).count() == 16
        assert Action.objects.filter(jobs=job_id).count() == 1
    assert consistent_violations() == []
