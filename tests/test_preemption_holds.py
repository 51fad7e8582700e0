"""A recovery that preempts holds its nodes as a defrag plan does: between the
preemption and the swap, the node the victim frees is the recovery's, so the
scheduler cannot take it (the 30-minute soak saw 3 of 24 approvals fail at
their swap after stopping the victim: "replacement node ... is no longer
free"). A recovery that fails after preempting restarts the victim where it was.

The fleet: rack r1 runs a 16-node training job and a preemptible 2-node filler
on its spares; rack r2 is full. A node under the training job fails: the only
way to recover in place is to preempt the filler.
"""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Job, Node, NodeHold
from fleet.services.actions import propose as action_services
from fleet.services.decisions import scheduling
from fleet.services.decisions.recovery import plan_recovery
from fleet.services.execution import execute as execution
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from tests.support import InstantAdapter, nodes_of
from tests.test_defrag_holds import FailAt

pytestmark = pytest.mark.django_db(transaction=True)


def _run(submitter, rack, slots, *, name: str, priority: int, preemptible: bool) -> Job:
    job = submit_job(
        submitter,
        JobSpec(
            name=name,
            num_nodes=len(slots),
            gpus_per_node=4,
            tenant="llm",
            priority=priority,
            preemptible=preemptible,
            expected_duration_s=10**6,
        ),
    )
    nodes = Node.objects.filter(rack=rack, slot__in=list(slots))
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


@pytest.fixture
def preemption(fleet, submitter, operator):
    r1, r2 = fleet
    train = _run(submitter, r1, range(16), name="train", priority=10, preemptible=False)
    filler = _run(submitter, r1, range(16, 18), name="filler", priority=0, preemptible=True)
    _run(submitter, r2, range(18), name="wall", priority=10, preemptible=False)
    failed = Node.objects.get(pk=min(nodes_of(train.pk)))
    node_services.mark_node_failed(operator, failed.pk, "XID 79")
    action = plan_recovery(train.pk)
    assert action is not None and action.kind == ActionKind.PREEMPTION
    return train, filler, action_services.approve(operator, action.pk, "go")


def _step(action_id: int, adapter=None) -> None:
    execution.execute_next_step(action_id, adapter=adapter or InstantAdapter())


def test_the_node_a_preemption_frees_is_held_for_its_swap(preemption, submitter):
    train, filler, action = preemption
    target = {int(t) for s in action.steps if s["op"] == "swap" for t in s["swaps"].values()}
    assert target and target <= set(NodeHold.objects.filter(action=action).values_list("node_id", flat=True))

    _step(action.pk)  # preempt the filler: its two nodes are free
    assert Job.objects.get(pk=filler.pk).state == JobState.PENDING
    small = submit_job(
        submitter,
        JobSpec(
            name="small", num_nodes=1, gpus_per_node=4, tenant="llm", priority=20, expected_duration_s=600
        ),
    )
    scheduling.schedule_pass()
    assert not set(nodes_of(small.pk)) & target, "the scheduler took the node the swap needs"

    while execution.execute_next_step(action.pk, adapter=InstantAdapter()).more:
        pass
    assert Action.objects.get(pk=action.pk).state == ActionState.SUCCEEDED
    assert Job.objects.get(pk=train.pk).state == JobState.RUNNING
    assert not NodeHold.objects.filter(action=action).exists()


def test_a_preemption_that_fails_after_stopping_its_victim_restarts_it_where_it_was(preemption):
    _train, filler, action = preemption
    before = set(nodes_of(filler.pk))
    adapter = FailAt(1)
    while execution.execute_next_step(action.pk, adapter=adapter).more:
        pass
    action = Action.objects.get(pk=action.pk)
    assert action.state == ActionState.FAILED
    assert "rolled back" in action.error
    assert Job.objects.get(pk=filler.pk).state == JobState.RUNNING
    assert set(nodes_of(filler.pk)) == before
    assert not NodeHold.objects.filter(action=action).exists()
