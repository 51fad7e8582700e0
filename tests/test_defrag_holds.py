"""Holds: from its approval to its end, a defrag plan holds the nodes it empties
(where the jobs it moves run, and the room it clears in a rack) and the nodes it
fills. The scheduler places nothing there and does not place again a job the
plan is moving, recovery does not swap into them, another plan cannot take them,
and every end of the plan releases them (the lifecycle), with an audit record
and the racks' versions moved, so the in-memory fleet and the console follow.

The fleet: rack r1 runs a preemptible 4-node job A; rack r2 runs a
non-preemptible 4-node job B on slots 0-3 and a non-preemptible 10-node job H on
slots 8-17, so its only room is slots 4-7. A required 16-node job C waits: the
plan moves A to r2's slots 4-7 and clears r1 for C.
"""

from __future__ import annotations

import pytest

from fleet import engine
from fleet.choices import ActionKind, ActionState, JobState
from fleet.cluster.base import StepFailed
from fleet.cluster.simulated import SimulatedAdapter
from fleet.models import Action, AuditEvent, Job, Node, NodeHold, Rack
from fleet.services.actions import lifecycle as action_lifecycle
from fleet.services.actions import propose as action_services
from fleet.services.decisions import defrag as defrag_services
from fleet.services.decisions import scheduling
from fleet.services.decisions.recovery import plan_recovery
from fleet.services.errors import Conflict
from fleet.services.execution import execute as execution
from fleet.services.jobs.allocations import apply_placement, finish_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from tests.support import InstantAdapter, nodes_of

pytestmark = pytest.mark.django_db(transaction=True)


def _run(submitter, rack, slots, *, name: str, preemptible: bool, priority: int = 0) -> Job:
    job = submit_job(
        submitter,
        JobSpec(
            name=name,
            num_nodes=len(slots),
            gpus_per_node=4,
            tenant="llm",
            preemptible=preemptible,
            priority=priority,
            expected_duration_s=10**6,
        ),
    )
    nodes = Node.objects.filter(rack=rack, slot__in=list(slots))
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


@pytest.fixture
def tight(fleet, submitter):
    r1, r2 = fleet
    a = _run(submitter, r1, range(4), name="a", preemptible=True)
    b = _run(submitter, r2, range(4), name="b", preemptible=False)
    h = _run(submitter, r2, range(8, 18), name="h", preemptible=False, priority=10)
    c = submit_job(
        submitter, JobSpec(name="c", num_nodes=16, gpus_per_node=4, tenant="llm", expected_duration_s=10**6)
    )
    return a, b, h, c


def _approved_plan(operator) -> Action:
    plan = defrag_services.plan_defrag(operator).action
    assert plan is not None and plan.state == ActionState.PROPOSED
    return action_services.approve(operator, plan.pk, "go")


def _held(action: Action) -> dict[int, str]:
    return dict(NodeHold.objects.filter(action=action).values_list("node_id", "role"))


def _slots(rack: Rack, node_ids) -> set[int]:
    return set(Node.objects.filter(rack=rack, pk__in=list(node_ids)).values_list("slot", flat=True))


class FailAt(InstantAdapter):
    """A cluster that refuses step ``index`` of a plan for good."""

    def __init__(self, index: int) -> None:
        self.index = index

    def perform(self, action, index, step, report=None):
        if index == self.index:
            raise StepFailed(f"the cluster refused {step.op}")
        return super().perform(action, index, step, report)


def _execute(action_id: int, adapter=None) -> None:
    adapter = adapter or InstantAdapter()
    while execution.execute_next_step(action_id, adapter=adapter).more:
        pass


def test_approval_holds_what_the_plan_empties_and_fills_and_says_so(tight, fleet, operator):
    a, _, _, _ = tight
    r1, r2 = fleet
    plan = _approved_plan(operator)

    held = _held(plan)
    assert _slots(r1, held) == set(range(18)), "A's nodes and the room the plan clears in r1"
    assert {n for n, role in held.items() if role == "fill"} == {
        n.pk for n in Node.objects.filter(rack=r2, slot__in=range(4, 8))
    }
    assert nodes_of(a.pk) <= {n for n, role in held.items() if role == "empty"}
    hold = AuditEvent.objects.get(action="action.hold", object_id=str(plan.pk))
    assert hold.after == {"nodes": 22, "emptied": 18, "filled": 4}
    # The engine's view: held nodes take no new work; the plan's own check sees them as its own.
    with engine.live_snapshot() as snap:
        assert {int(n) for n in snap.held} == set(held)
        assert all(snap.fleet.nodes[str(n)].health == "draining" for n in held)
    assert action_services.check_plan(plan) == []


def test_the_scheduler_places_nothing_on_held_nodes_and_the_plan_achieves_its_goal(
    tight, fleet, operator, submitter
):
    """On the code before holds, the new job took room in r1 and the plan
    succeeded for nothing: C still did not fit."""
    a, _, _, c = tight
    r1, r2 = fleet
    plan = _approved_plan(operator)
    d = submit_job(
        submitter, JobSpec(name="d", num_nodes=2, gpus_per_node=4, tenant="llm", expected_duration_s=10**6)
    )

    scheduling.schedule_pass()

    assert not NodeHold.objects.filter(node_id__in=nodes_of(d.pk)).exists()
    assert Job.objects.get(pk=c.pk).state == JobState.PENDING
    _execute(plan.pk)
    assert Action.objects.get(pk=plan.pk).state == ActionState.SUCCEEDED
    assert not NodeHold.objects.exists()
    scheduling.schedule_pass()
    assert Job.objects.get(pk=c.pk).state == JobState.PLACED, (
        "the room the plan made went to the job it was made for"
    )
    assert {Node.objects.get(pk=n).rack_id for n in nodes_of(c.pk)} == {r1.pk}
    assert {Node.objects.get(pk=n).rack_id for n in nodes_of(a.pk)} == {r2.pk}


def test_the_scheduler_does_not_place_again_a_job_the_plan_is_moving(tight, operator):
    a, _, _, _ = tight
    plan = _approved_plan(operator)
    adapter = InstantAdapter()
    assert execution.execute_next_step(plan.pk, adapter=adapter).more  # checkpoint
    assert execution.execute_next_step(plan.pk, adapter=adapter).more  # stop: A waits, held by the plan
    assert Job.objects.get(pk=a.pk).state == JobState.PENDING

    result = scheduling.schedule_pass()

    assert a.pk not in result.placed and Job.objects.get(pk=a.pk).state == JobState.PENDING
    _execute(plan.pk, adapter)
    assert Job.objects.get(pk=a.pk).state == JobState.RUNNING


def test_recovery_does_not_swap_into_a_node_the_plan_fills(tight, fleet, operator):
    """H loses a node; the only idle nodes of its rack are the four the plan
    fills. Before holds, the in-place swap took one of them and the plan was
    stale before it began."""
    _, _, h, _ = tight
    plan = _approved_plan(operator)
    fills = {int(n) for s in plan.steps if s["op"] == "allocate" for n in s["nodes"]}
    victim = Node.objects.get(rack=fleet[1], slot=8)
    node_services.mark_node_failed(None, victim.pk, "XID 79")

    recovery = plan_recovery(h.pk)

    assert recovery is not None
    targets = {int(t) for s in recovery.steps if s["op"] == "swap" for t in s["swaps"].values()}
    targets |= {int(n) for s in recovery.steps if s["op"] == "allocate" for n in s["nodes"]}
    assert not targets & fills, recovery.steps
    assert set(_held(plan)) >= fills
    assert action_services.check_plan(Action.objects.get(pk=plan.pk)) == []


def test_another_plan_cannot_take_held_nodes(tight, operator):
    a, _, _, _ = tight
    plan = _approved_plan(operator)
    fill = next(n for n, role in _held(plan).items() if role == "fill")
    # A migration of A onto one of the nodes the defrag plan fills.
    other = action_services.propose(
        kind=ActionKind.MIGRATION,
        title="move a job onto a held node",
        steps=[
            {"op": "stop", "job": a.pk},
            {"op": "allocate", "job": a.pk, "nodes": {fill: [0, 1, 2, 3]}},
            {"op": "start", "job": a.pk},
        ],
        jobs=[a.pk],
    )

    with pytest.raises(Conflict, match=f"held for action #{plan.pk}"):
        action_services.approve(operator, other.pk)

    other.refresh_from_db()
    assert other.state == ActionState.EXPIRED and f"held for action #{plan.pk}" in other.error
    assert not NodeHold.objects.filter(action=other).exists()
    # And at the database: a node is held by one action at most.
    other.plan = {"steps": [{"op": "allocate", "job": a.pk, "nodes": {fill: [0]}}]}
    other.step_index = 0
    with pytest.raises(Conflict, match="already held"):
        action_lifecycle.take_holds(None, other)


def _end(plan: Action, how: str, tight, operator) -> None:
    a = tight[0]
    if how == "succeeded":
        _execute(plan.pk)
    elif how == "failed":
        _execute(plan.pk, FailAt(2))
    elif how == "cancelled":
        action_services.cancel(operator, plan.pk, "not now")
    elif how == "expired":
        # A finishes: the plan's move is stale, and with r1 free there is nothing
        # left to plan, so it expires saying why before its first step.
        finish_job(None, a.pk, succeeded=True)
        _execute(plan.pk)


@pytest.mark.parametrize("how", ["succeeded", "failed", "cancelled", "expired"])
def test_every_end_of_the_plan_releases_its_holds(tight, operator, how):
    plan = _approved_plan(operator)
    racks = set(NodeHold.objects.filter(action=plan).values_list("node__rack_id", flat=True))
    versions = dict(Rack.objects.filter(pk__in=racks).values_list("pk", "version"))

    _end(plan, how, tight, operator)

    plan.refresh_from_db()
    assert plan.state == how, plan.error
    assert not NodeHold.objects.filter(action=plan).exists()
    assert AuditEvent.objects.filter(action="action.release", object_id=str(plan.pk)).count() == 1
    assert all(Rack.objects.get(pk=r).version > v for r, v in versions.items())
    with engine.live_snapshot() as snap:  # verified against a fresh load (RACKWISE_LIVE_FLEET_VERIFY)
        assert not snap.held
    if how == "expired":
        assert "no new plan" in plan.error


def test_a_rejected_plan_never_held_anything(tight, operator):
    plan = defrag_services.plan_defrag(operator).action
    action_services.reject(operator, plan.pk, "no")
    assert not NodeHold.objects.exists()
    assert not AuditEvent.objects.filter(action="action.hold").exists()


def test_reconcile_releases_holds_left_by_an_end_outside_the_lifecycle(tight, operator):
    from fleet.tasks import reconcile_once

    plan = _approved_plan(operator)
    Action.objects.filter(pk=plan.pk).update(state=ActionState.CANCELLED)  # a write outside the services

    assert reconcile_once()["holds_released"] == [plan.pk]
    assert not NodeHold.objects.exists()


def test_the_simulated_cluster_fails_a_given_step_and_the_plan_lets_go_of_its_nodes(tight, operator):
    """The simulated cluster's failure injection for a given step (``fail_at``);
    a plan failing at its first step has stopped nothing and releases its holds."""
    plan = _approved_plan(operator)
    _execute(plan.pk, SimulatedAdapter(0, 0, 0.01, fail_at={0}))
    plan.refresh_from_db()
    assert (
        plan.state == ActionState.FAILED and "simulated failure injected in checkpoint (step 1)" in plan.error
    )
    assert plan.lost_gpu_hours == 0.0 and not NodeHold.objects.exists()
