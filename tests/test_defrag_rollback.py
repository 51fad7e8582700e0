"""Rollback: a defrag plan that fails midway puts every job it stopped back to
running in the same pass (on its old nodes, or where the plan had already
placed it), while it still holds their nodes, and records what the failure
cost in GPU-hours: on the action, in the API and on its card.

The fleet: rack r1 runs two preemptible 4-node jobs, A1 and A2; rack r2 runs a
non-preemptible 4-node job B. A required 16-node job C waits: the plan moves A1
and A2 to r2 (8 steps: checkpoint, stop, allocate, start for each)."""

from __future__ import annotations

import pytest

from fleet.choices import ActionState, JobState
from fleet.cluster.base import StepFailed
from fleet.models import Action, Job, Node, NodeHold
from fleet.services.actions import propose as action_services
from fleet.services.decisions import defrag as defrag_services
from fleet.services.execution import execute as execution
from fleet.services.jobs.allocations import apply_placement, finish_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.support import InstantAdapter, nodes_of

pytestmark = pytest.mark.django_db(transaction=True)


def _run(submitter, rack, slots, *, name: str, preemptible: bool) -> Job:
    job = submit_job(
        submitter,
        JobSpec(
            name=name,
            num_nodes=len(slots),
            gpus_per_node=4,
            tenant="llm",
            preemptible=preemptible,
            expected_duration_s=10**6,
            checkpoint_interval_s=3600,
        ),
    )
    nodes = Node.objects.filter(rack=rack, slot__in=list(slots))
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


@pytest.fixture
def two_moves(fleet, submitter, operator):
    r1, r2 = fleet
    a1 = _run(submitter, r1, range(4), name="a1", preemptible=True)
    a2 = _run(submitter, r1, range(4, 8), name="a2", preemptible=True)
    _run(submitter, r2, range(4), name="b", preemptible=False)
    submit_job(
        submitter, JobSpec(name="c", num_nodes=16, gpus_per_node=4, tenant="llm", expected_duration_s=10**6)
    )
    plan = defrag_services.plan_defrag(operator).action
    assert plan is not None
    assert [s["op"] for s in plan.steps] == ["checkpoint", "stop", "allocate", "start"] * 2
    assert {s["job"] for s in plan.steps} == {a1.pk, a2.pk}
    plan = action_services.approve(operator, plan.pk, "go")
    return plan, a1, a2


class FailAt(InstantAdapter):
    """A cluster that refuses the plan's step ``index`` for good (as the simulated
    cluster's ``fail_at`` does) and carries out every other step at once."""

    def __init__(self, index: int) -> None:
        self.index = index

    def perform(self, action, index, step, report=None):
        if index == self.index:
            raise StepFailed(f"the cluster refused {step.op} (step {index + 1})")
        return super().perform(action, index, step, report)


def _move_costs(plan: Action) -> dict[int, float]:
    return {int(m["job_id"]): m["cost_gpu_hours"] for m in plan.plan["engine"]["moves"]}


def _run_until_it_ends(plan: Action, adapter) -> Action:
    while execution.execute_next_step(plan.pk, adapter=adapter).more:
        pass
    return Action.objects.get(pk=plan.pk)


def _first_and_second(plan: Action) -> tuple[int, int]:
    stops = [s["job"] for s in plan.steps if s["op"] == "stop"]
    return stops[0], stops[1]


def test_a_failed_allocate_puts_the_stopped_job_back_on_its_old_nodes(two_moves, operator_client):
    plan, _, _ = two_moves
    first, second = _first_and_second(plan)
    second_nodes = nodes_of(second)
    costs = _move_costs(plan)

    done = _run_until_it_ends(plan, FailAt(6))  # the second allocate

    assert done.state == ActionState.FAILED
    assert Job.objects.get(pk=second).state == JobState.RUNNING, (
        "the stopped job runs again, in the same pass"
    )
    assert nodes_of(second) == second_nodes, "on its old nodes, which the plan still held"
    assert Job.objects.get(pk=first).state == JobState.RUNNING  # moved before the failure: stays moved
    assert done.lost_gpu_hours == pytest.approx(costs[first] + costs[second], abs=1e-3)
    assert done.lost_gpu_hours == pytest.approx(done.cost_gpu_hours, abs=1e-3)
    assert (
        "rolled back: 1 stopped job(s) running again (1 on their old nodes, 0 on their new ones)"
        in done.error
    )
    assert f"{done.lost_gpu_hours:.1f} GPU-hours lost" in done.error
    assert [e["op"] for e in done.log][-2:] == ["allocate", "rollback"]
    assert not NodeHold.objects.exists()

    body = operator_client.get(f"/api/actions/{plan.pk}/").json()
    assert body["lost_gpu_hours"] == pytest.approx(done.lost_gpu_hours)
    assert body["holds"] == []


def test_a_failure_before_any_stop_costs_nothing_and_moves_nothing(two_moves):
    plan, a1, a2 = two_moves
    before = {a1.pk: nodes_of(a1.pk), a2.pk: nodes_of(a2.pk)}

    done = _run_until_it_ends(plan, FailAt(0))  # the first checkpoint

    assert {j: nodes_of(j) for j in before} == before
    assert all(Job.objects.get(pk=j).state == JobState.RUNNING for j in before)
    assert done.state == ActionState.FAILED and done.lost_gpu_hours == 0.0


def test_a_failure_after_a_stop_costs_that_move(two_moves):
    plan, _, _ = two_moves
    first, _ = _first_and_second(plan)
    first_nodes = nodes_of(first)

    done = _run_until_it_ends(plan, FailAt(2))  # the first allocate

    assert done.state == ActionState.FAILED
    assert Job.objects.get(pk=first).state == JobState.RUNNING and nodes_of(first) == first_nodes
    assert done.lost_gpu_hours == pytest.approx(_move_costs(plan)[first], abs=1e-3)
    assert 0 < done.lost_gpu_hours < done.cost_gpu_hours


def test_a_gpu_taken_under_the_plan_fails_it_and_the_stopped_job_runs_again(two_moves, submitter):
    """The third failure seen on the demo: a GPU of the plan's destination was
    taken (here by a write that ignores the holds), step "allocate" failed with
    "the plan is stale", and the stopped jobs were left waiting in the queue."""
    plan, _, _ = two_moves
    first, second = _first_and_second(plan)
    second_nodes = nodes_of(second)
    adapter = InstantAdapter()
    for _ in range(6):  # the first move, then the second job's checkpoint and stop
        assert execution.execute_next_step(plan.pk, adapter=adapter).more
    target = next(
        int(n) for s in plan.steps if s["op"] == "allocate" and s["job"] == second for n in s["nodes"]
    )
    intruder = submit_job(submitter, JobSpec(name="x", num_gpus=1, tenant="llm"))
    NodeHold.objects.filter(node_id=target).delete()
    apply_placement(None, intruder.pk, {target: [0]}, reason="a write outside the plan")

    result = execution.execute_next_step(plan.pk, adapter=adapter)

    done = Action.objects.get(pk=plan.pk)
    assert result.message == "failed" and done.state == ActionState.FAILED
    assert "already allocated" in done.error
    assert Job.objects.get(pk=second).state == JobState.RUNNING and nodes_of(second) == second_nodes
    assert Job.objects.get(pk=first).state == JobState.RUNNING
    assert done.lost_gpu_hours == pytest.approx(done.cost_gpu_hours, abs=1e-3)


def test_a_refused_start_is_tried_again_where_the_job_was_placed(two_moves):
    plan, _, _ = two_moves
    _, second = _first_and_second(plan)
    planned = {int(n) for s in plan.steps if s["op"] == "allocate" and s["job"] == second for n in s["nodes"]}

    done = _run_until_it_ends(plan, FailAt(7))  # the second start

    assert done.state == ActionState.FAILED
    assert Job.objects.get(pk=second).state == JobState.RUNNING and nodes_of(second) == planned
    assert "(0 on their old nodes, 1 on their new ones)" in done.error


def test_the_card_shows_what_the_failure_cost(two_moves, client, operator):
    plan, _, _ = two_moves
    done = _run_until_it_ends(plan, FailAt(6))
    client.force_login(operator)

    html = client.get(f"/actions/{plan.pk}/fragment/").content.decode()

    assert 'data-testid="lost-gpu-hours">' + f"{done.lost_gpu_hours:.1f}<" in html
    assert "this plan meets it" not in html
    assert "not met: the plan failed" in html
    assert "Failed: step 7 (allocate) failed" in html


# --- a job that ends by itself mid-plan ------------------------------------------------
# Its room is made: the plan skips that job's remaining steps and succeeds,
# paying nothing for it. (The 4-minute soak saw a plan fail on the stop of a job
# that had just completed, after it had moved another: 0.25 GPU-hours lost.)


def _steps(plan: Action, count: int) -> None:
    for _ in range(count):
        assert execution.execute_next_step(plan.pk, adapter=InstantAdapter()).more


@pytest.mark.parametrize("done_before", [4, 5])  # before the second job's checkpoint, or its stop
def test_a_job_that_completes_mid_plan_has_its_steps_skipped_and_the_plan_succeeds(two_moves, done_before):
    plan, _, _ = two_moves
    first, second = _first_and_second(plan)
    moved_to = {s["job"]: s["nodes"] for s in plan.steps if s["op"] == "allocate"}
    _steps(plan, done_before)

    finish_job(None, second, succeeded=True, reason="it ended on its own")
    while execution.execute_next_step(plan.pk, adapter=InstantAdapter()).more:
        pass

    done = Action.objects.get(pk=plan.pk)
    assert done.state == ActionState.SUCCEEDED, done.error
    # It paid for the move it made, and nothing for the job that ended.
    assert done.lost_gpu_hours == pytest.approx(_move_costs(plan)[first], abs=1e-3)
    assert Job.objects.get(pk=second).state == JobState.COMPLETED  # not placed again by the plan
    assert nodes_of(second) == set()
    assert Job.objects.get(pk=first).state == JobState.RUNNING
    assert nodes_of(first) == {int(k) for k in moved_to[first]}
    skipped = [e for e in done.log if e.get("status") == "skipped"]
    assert [e["op"] for e in skipped] == ["checkpoint", "stop", "allocate", "start"][done_before - 4 :]
    assert all(f"job #{second} ended (completed)" in e["message"] for e in skipped)
    assert not NodeHold.objects.exists()
