"""The control loop end to end with real Celery worker processes on the test
PostgreSQL and Redis: placement, in-place recovery, and defrag plans that are
approved, rejected or expire."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Allocation, AuditEvent, Job, Node
from fleet.services.jobs import allocations as job_allocations
from tests.support import nodes_of, wait_for, workers

pytestmark = pytest.mark.django_db(transaction=True)


def _job(job_id: int, **state) -> Job | None:
    return Job.objects.filter(pk=job_id, **state).first()


def test_a_submitted_job_is_placed_started_and_completed_by_a_worker(fleet, submitter_client):
    with workers(1):
        response = submitter_client.post(
            "/api/jobs/",
            {
                "name": "train",
                "num_nodes": 8,
                "gpus_per_node": 4,
                "expected_duration_s": 100,
                "tenant": "llm",
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        job_id = response.json()["id"]
        job = wait_for(lambda: _job(job_id, state=JobState.COMPLETED), 30, "the job to complete")

    trail = list(
        AuditEvent.objects.filter(object_type="job", object_id=str(job_id))
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert trail == ["job.submit", "job.place", "job.start", "job.finish"]
    assert len(job_allocations.placement_of(job)["racks"]) == 1, (
        "an 8-node job fits one rack and must stay in it"
    )
    assert Allocation.objects.filter(job_id=job_id).count() == 32
    assert not nodes_of(job_id)
    action = Action.objects.get(jobs=job_id)
    assert (action.kind, action.state, action.step_index) == (ActionKind.PLACEMENT, ActionState.SUCCEEDED, 2)
    # One record of the placement: the allocate step (and the rows it wrote),
    # no copy of the engine's plan beside it.
    assert set(action.plan) == {"steps"}
    assert {int(n) for n in action.steps[0]["nodes"]} == {
        a.gpu.node_id for a in Allocation.objects.filter(job_id=job_id)
    }


def test_a_failed_node_is_swapped_for_a_spare_in_the_same_rack_keeping_the_others(
    fleet, submitter_client, operator_client
):
    with workers(1):
        response = submitter_client.post(
            "/api/jobs/",
            {
                "name": "pretrain",
                "num_nodes": 16,
                "gpus_per_node": 4,
                "expected_duration_s": 10**6,
                "tenant": "llm",
            },
            format="json",
        )
        job_id = response.json()["id"]
        wait_for(lambda: _job(job_id, state=JobState.RUNNING), 30, "the job to run")
        before = nodes_of(job_id)
        victim = min(before)
        response = operator_client.post(
            f"/api/nodes/{victim}/mark-failed/", {"reason": "XID 79", "confirm": True}, format="json"
        )
        assert response.status_code == 200
        wait_for(lambda: _job(job_id, state=JobState.RUNNING, attempt=2), 30, "the job to restart in place")
        wait_for(
            lambda: Action.objects.filter(
                jobs=job_id, kind=ActionKind.RECOVERY, state=ActionState.SUCCEEDED
            ).exists(),
            30,
            "the recovery to finish",
        )

    after = nodes_of(job_id)
    assert before - after == {victim}
    (replacement,) = after - before
    assert Node.objects.get(pk=replacement).rack_id == Node.objects.get(pk=victim).rack_id
    recovery = Action.objects.get(jobs=job_id, kind=ActionKind.RECOVERY)
    assert recovery.state == ActionState.SUCCEEDED
    assert [s["op"] for s in recovery.steps] == ["swap", "restart"]


def _propose_defrag(operator_client) -> dict:
    response = operator_client.post("/api/actions/defrag/", {}, format="json")
    assert response.status_code == 201, response.content
    plan = response.json()
    assert plan["kind"] == ActionKind.DEFRAG and plan["state"] == ActionState.PROPOSED
    return plan


def test_an_approved_defrag_plan_runs_step_by_step_and_the_waiting_job_is_placed(
    fragmented, fleet, operator_client
):
    a, b, c = fragmented
    b_nodes = nodes_of(b.pk)
    with workers(1):
        plan = _propose_defrag(operator_client)
        assert plan["jobs"] == [a.pk]
        assert plan["benefit"]["jobs_made_placeable"] == [c.pk]
        assert plan["cost_gpu_hours"] > 0
        response = operator_client.post(f"/api/actions/{plan['id']}/approve/", {"note": "go"}, format="json")
        assert response.status_code == 200
        wait_for(
            lambda: Action.objects.filter(pk=plan["id"], state=ActionState.SUCCEEDED).exists(),
            30,
            "the plan to run",
        )
        wait_for(lambda: _job(c.pk, state=JobState.RUNNING), 30, "the waiting job to start")

    r1, r2 = fleet
    assert {Node.objects.get(pk=n).rack_id for n in nodes_of(a.pk)} == {r2.pk}
    assert _job(a.pk).state == JobState.RUNNING
    assert nodes_of(b.pk) == b_nodes, "a non-preemptible job never moves"
    assert {Node.objects.get(pk=n).rack_id for n in nodes_of(c.pk)} == {r1.pk}
    done = Action.objects.get(pk=plan["id"])
    assert [entry["op"] for entry in done.log] == ["checkpoint", "stop", "allocate", "start"]
    assert AuditEvent.objects.filter(action="action.approve", object_id=str(done.pk)).exists()
    assert AuditEvent.objects.filter(action="action.step", object_id=str(done.pk)).count() == 4


def test_a_rejected_defrag_plan_moves_nothing(fragmented, operator_client):
    a, _, c = fragmented
    a_nodes = nodes_of(a.pk)
    with workers(1):
        plan = _propose_defrag(operator_client)
        response = operator_client.post(
            f"/api/actions/{plan['id']}/reject/", {"note": "not now"}, format="json"
        )
        assert response.status_code == 200
        assert response.json()["state"] == ActionState.REJECTED
        again = operator_client.post(f"/api/actions/{plan['id']}/approve/", {}, format="json")
        assert again.status_code == 409
    assert nodes_of(a.pk) == a_nodes
    assert _job(c.pk).state == JobState.PENDING
    assert AuditEvent.objects.filter(action="action.reject", object_id=str(plan["id"])).exists()


def test_a_plan_the_fleet_has_moved_away_from_expires_and_a_new_one_is_proposed(fragmented, operator_client):
    a, _, _ = fragmented
    with workers(1):
        plan = _propose_defrag(operator_client)
        target = int(
            next(step for step in plan["plan"]["steps"] if step["op"] == "allocate")["nodes"].popitem()[0]
        )
        # The fleet changes under the plan: one of its destination nodes fails.
        assert (
            operator_client.post(
                f"/api/nodes/{target}/mark-failed/", {"reason": "XID 79"}, format="json"
            ).status_code
            == 200
        )
        operator_client.post(f"/api/actions/{plan['id']}/approve/", {}, format="json")
        expired = wait_for(
            lambda: Action.objects.filter(pk=plan["id"], state=ActionState.EXPIRED).first(),
            30,
            "the plan to expire",
        )
        assert "failed" in expired.error
        fresh = wait_for(
            lambda: (
                Action.objects.filter(kind=ActionKind.DEFRAG, state=ActionState.PROPOSED)
                .exclude(pk=plan["id"])
                .first()
            ),
            30,
            "a new plan",
        )
    new_targets = {int(n) for s in fresh.steps if s["op"] == "allocate" for n in s["nodes"]}
    assert target not in new_targets
    assert _job(a.pk).state == JobState.RUNNING, "nothing moved under the expired plan"
