"""A job that ends by itself while a defrag plan is moving jobs has made its
room: the plan skips that job's remaining steps and succeeds, paying nothing
for that job. (The 4-minute soak saw a plan fail on the stop of a job that had just
completed, after it had moved another job: 0.25 GPU-hours lost.)

The fleet is test_defrag_rollback's: the plan moves A1 and A2 off rack r1 so a
16-node job fits, in 8 steps (checkpoint, stop, allocate, start for each)."""

from __future__ import annotations

import pytest

from fleet.choices import ActionState, JobState
from fleet.models import Action, Job, NodeHold
from fleet.services import actions as action_services
from fleet.services.jobs import finish_job
from tests.support import InstantAdapter, nodes_of
from tests.test_defrag_rollback import _first_and_second, _move_costs, two_moves  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _steps(plan: Action, count: int) -> None:
    for _ in range(count):
        assert action_services.execute_next_step(plan.pk, adapter=InstantAdapter()).more


@pytest.mark.parametrize("done_before", [4, 5])  # before the second job's checkpoint, or its stop
def test_a_job_that_completes_mid_plan_has_its_steps_skipped_and_the_plan_succeeds(two_moves, done_before):
    plan, _, _ = two_moves
    first, second = _first_and_second(plan)
    moved_to = {s["job"]: s["nodes"] for s in plan.steps if s["op"] == "allocate"}
    _steps(plan, done_before)

    finish_job(None, second, succeeded=True, reason="it ended on its own")
    while action_services.execute_next_step(plan.pk, adapter=InstantAdapter()).more:
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
    assert [e["op"] for e in skipped] == ["checkpoint", "stop", "allocate", "start"][done_before - 4:]
    assert all(f"job #{second} ended (completed)" in e["message"] for e in skipped)
    assert not NodeHold.objects.exists()
