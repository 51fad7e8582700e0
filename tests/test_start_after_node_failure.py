"""A placed job whose node fails before it starts is recovering: the placement's
start step must not run it on the failed node (the 30-minute soak saw a job
start there 0.5 s after the failure and run on it for two minutes, until the
node was repaired). The start is refused, the placement fails, and the job is
left to its recovery, which swaps the node and restarts it."""

from __future__ import annotations

import pytest

from fleet import steps as st
from fleet.choices import ActionKind, ActionState, JobState
from fleet.services.actions import propose as action_services
from fleet.services.execution import execute as execution
from fleet.services.jobs import submit as job_services
from fleet.services.nodes.moves import mark_node_failed
from tests.support import InstantAdapter

pytestmark = pytest.mark.django_db


def test_a_placed_job_whose_node_failed_is_not_started_by_its_placement(fleet, submitter, operator):
    held = list(fleet[0].nodes.order_by("slot")[:2])
    job = job_services.submit_job(submitter, job_services.JobSpec(name="gang", num_gpus=8, tenant="llm"))
    action = action_services.propose(
        kind=ActionKind.PLACEMENT,
        title="place",
        steps=[
            st.Allocate(
                job=job.pk, nodes={n.pk: [0, 1, 2, 3] for n in held}, hostnames=[n.hostname for n in held]
            ),
            st.Start(job=job.pk),
        ],
        jobs=[job.pk],
    )
    if action.state == ActionState.PROPOSED:
        action_services.approve(operator, action.pk, "")
    adapter = InstantAdapter()
    execution.execute_next_step(action.pk, adapter=adapter)  # allocate
    job.refresh_from_db()
    assert job.state == JobState.PLACED

    mark_node_failed(None, held[1].pk, "XID 79")
    while execution.execute_next_step(action.pk, adapter=adapter).more:
        pass

    job.refresh_from_db()
    action.refresh_from_db()
    assert job.state == JobState.RECOVERING, job.state_reason
    assert action.state == ActionState.FAILED and "recovering" in action.error
