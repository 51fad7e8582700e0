"""Re-planning instead of failing: a defrag plan that goes stale is made again
with its own request, in its place, instead of dying.

Why the demo's plans died (issue 27): the scheduler placed new work on the
nodes a plan was going to fill. A placement there did not even ask for a
recheck (only the racks where the plan's jobs ran did), and approval checked
nothing, so the operator approved a plan already stale and the worker expired
it 0.39 s later; or the recheck found it stale first and expired it before the
click got there. Changes elsewhere never expired a plan; they must not start to.

The fleet: ``fragmented`` (A in r1 moves next to B in r2 so that the waiting
16-node job C fits r1), and a third rack r3 running a job E, untouched by the plan.
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from fleet import dispatch
from fleet.choices import ActionState, JobState, RackKind
from fleet.models import Action, Allocation, Job, Node, NodeHold
from fleet.services.actions import propose as action_services
from fleet.services.decisions import defrag as defrag_services
from fleet.services.decisions import recheck as proposals
from fleet.services.decisions import scheduling
from fleet.services.execution import execute as execution
from fleet.services.jobs.allocations import apply_placement, finish_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from fleet.services.nodes.inventory import create_rack
from rackwise.asgi import application
from tests.sockets import run_socket_test
from tests.support import InstantAdapter, nodes_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plan(fragmented, operator) -> Action:
    action = defrag_services.plan_defrag(operator, defrag_services.DefragGoal(room_for_nodes=16)).action
    assert action is not None and action.state == ActionState.PROPOSED
    return action


@pytest.fixture
def r3_job(fleet, submitter) -> Job:
    r3 = create_rack(None, name="r3", kind=RackKind.NVL72, site="dc", row="B", position=3)
    job = submit_job(
        submitter, JobSpec(name="e", num_nodes=2, gpus_per_node=4, tenant="llm", expected_duration_s=10**6)
    )
    nodes = Node.objects.filter(rack=r3, slot__in=[0, 1])
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


def _destination(action: Action) -> list[int]:
    return [int(n) for s in action.steps if s["op"] == "allocate" for n in s["nodes"]]


def _take_a_destination(action: Action, submitter) -> Job:
    """New work on one of the plan's destination nodes, as the scheduler placed it on the demo."""
    job = submit_job(submitter, JobSpec(name="newcomer", num_gpus=4, tenant="llm", expected_duration_s=10**6))
    apply_placement(None, job.pk, {_destination(action)[0]: [0, 1, 2, 3]}, reason="the scheduler")
    return start_job(None, job.pk)


def _execute(action_id: int) -> Action:
    while execution.execute_next_step(action_id, adapter=InstantAdapter()).more:
        pass
    return Action.objects.get(pk=action_id)


def test_approving_a_plan_gone_stale_answers_409_with_the_new_plan_and_cost(plan, submitter, operator_client):
    newcomer = _take_a_destination(plan, submitter)

    answer = operator_client.post(f"/api/actions/{plan.pk}/approve/", {"note": "go"}, format="json")

    assert answer.status_code == 409, answer.content
    body = answer.json()
    new = body["action"]
    assert body["replanned"] is True and new["id"] != plan.pk and new["state"] == ActionState.PROPOSED
    assert new["replaces"] == plan.pk
    assert (
        body["cost_gpu_hours"] == new["cost_gpu_hours"]
        and body["previous_cost_gpu_hours"] == plan.cost_gpu_hours
    )
    assert (
        f"re-planned as #{new['id']}" in body["detail"]
        and f"approve #{new['id']} to confirm" in body["detail"]
    )
    assert not set(_destination(Action.objects.get(pk=new["id"]))) & nodes_of(newcomer.pk)
    assert new["plan"]["request"]["room_for_nodes"] == 16, "the new plan keeps the operator's target"
    old = operator_client.get(f"/api/actions/{plan.pk}/").json()
    assert old["state"] == ActionState.EXPIRED and old["replaced_by"] == new["id"]
    taken = Node.objects.get(pk=_destination(plan)[0]).hostname
    assert (
        f"stale at approval: job #{plan.jobs.get().pk}: node {taken} is taken "
        f"(job #{newcomer.pk} runs there now)" in old["error"]
    )
    assert not NodeHold.objects.exists(), "nothing held until the operator confirms"

    # Approving the old one again answers with the new one; confirming approves it.
    again = operator_client.post(f"/api/actions/{plan.pk}/approve/", {}, format="json")
    assert again.status_code == 409 and again.json()["action"]["id"] == new["id"]
    confirm = operator_client.post(f"/api/actions/{new['id']}/approve/", {"note": "confirmed"}, format="json")
    assert confirm.status_code == 200 and confirm.json()["state"] == ActionState.APPROVED
    assert len(confirm.json()["holds"]) > 0
    assert _execute(new["id"]).state == ActionState.SUCCEEDED


def test_new_work_on_a_waiting_plans_destination_has_it_re_planned_in_place(plan, submitter, fleet):
    """The scheduler's placement asks for a recheck of the racks it filled; the
    recheck makes the plan again (the console swaps its card for the new one)."""
    newcomer = submit_job(
        submitter,
        JobSpec(name="newcomer", num_nodes=1, gpus_per_node=4, tenant="llm", expected_duration_s=10**6),
    )
    # Place it where the plan was going, as the scheduler did on the demo.
    apply_placement(None, newcomer.pk, {_destination(plan)[0]: [0, 1, 2, 3]}, reason="the scheduler")
    dest_rack = Node.objects.get(pk=_destination(plan)[0]).rack_id

    result = proposals.recheck_proposals(rack_ids=[dest_rack])

    plan.refresh_from_db()
    assert result.expired == [plan.pk] and plan.state == ActionState.EXPIRED
    (new,) = Action.objects.filter(replaces=plan)
    assert result.proposed == [new.pk] and new.state == ActionState.PROPOSED
    assert plan.replaced_by == new.pk and f"re-planned as #{new.pk}" in plan.error
    assert new.plan["request"] == plan.plan["request"]
    assert proposals.filling([dest_rack]) == [new.pk]  # the new plan is watched there in turn


def test_the_scheduler_asks_for_that_recheck(plan, submitter, monkeypatch):
    destination = set(_destination(plan))
    busy = set(Allocation.objects.filter(released_at__isnull=True).values_list("gpu__node_id", flat=True))
    idle = [n for n in Node.objects.values_list("pk", flat=True) if n not in destination | busy]
    blocker = submit_job(
        submitter,
        JobSpec(name="blocker", num_nodes=len(idle), gpus_per_node=4, tenant="llm", locality="none"),
    )
    apply_placement(None, blocker.pk, {n: [0, 1, 2, 3] for n in idle}, reason="test setup")
    start_job(None, blocker.pk)
    newcomer = submit_job(submitter, JobSpec(name="newcomer", num_gpus=4, tenant="llm"))
    asked: list[list[int]] = []
    monkeypatch.setattr(dispatch, "recheck_proposals_soon", lambda racks: asked.append(list(racks)))

    result = scheduling.schedule_pass()

    assert newcomer.pk in result.placed and nodes_of(newcomer.pk) <= destination
    assert Node.objects.get(pk=min(destination)).rack_id in {r for racks in asked for r in racks}


def test_changes_elsewhere_do_not_expire_a_plan(plan, r3_job, submitter, operator):
    """A job ending in a rack the plan does not touch, a node failing and coming
    back there, new work placed there: the plan waits, is approved and runs."""
    r3 = Node.objects.filter(pk__in=nodes_of(r3_job.pk)).first().rack_id
    finish_job(None, r3_job.pk, succeeded=True)
    spare = Node.objects.get(rack_id=r3, slot=17)
    node_services.mark_node_failed(None, spare.pk, "XID 79")
    node_services.return_node_to_service(None, spare.pk, "repaired")
    other = submit_job(
        submitter,
        JobSpec(name="elsewhere", num_nodes=2, gpus_per_node=4, tenant="llm", expected_duration_s=10**6),
    )
    apply_placement(
        None,
        other.pk,
        {n.pk: [0, 1, 2, 3] for n in Node.objects.filter(rack_id=r3, slot__in=[5, 6])},
        reason="the scheduler",
    )

    result = proposals.recheck_proposals(rack_ids=[r3])
    plan.refresh_from_db()
    assert plan.state == ActionState.PROPOSED and result.expired == []

    approved = action_services.approve(operator, plan.pk)
    assert approved.state == ActionState.APPROVED
    assert _execute(plan.pk).state == ActionState.SUCCEEDED


def test_an_approved_plan_stale_before_its_first_step_is_re_planned_and_runs(plan, fragmented, operator):
    """A node it was to fill failed after approval (holds keep other work off,
    not failures): the re-check before the first stop makes the plan again, and
    the new plan, costing no more, runs on the same approval."""
    a, _, _ = fragmented
    approved = action_services.approve(operator, plan.pk, "go")
    node_services.mark_node_failed(None, _destination(approved)[0], "XID 79")

    result = execution.execute_next_step(plan.pk, adapter=InstantAdapter())

    plan.refresh_from_db()
    assert plan.state == ActionState.EXPIRED and "stale before its first step" in plan.error
    assert Job.objects.get(pk=a.pk).state == JobState.RUNNING, "no job stopped"
    new = Action.objects.get(replaces=plan)
    assert result.message == f"re-planned as #{new.pk} (approved)"
    assert new.state == ActionState.APPROVED and new.decided_by_name == f"olga (approved #{plan.pk})"
    assert _execute(new.pk).state == ActionState.SUCCEEDED


def test_an_expired_plan_says_why_in_the_api_the_live_event_and_its_card(plan, fragmented, operator):
    """It expires for good here: A ended, so r1 is free and there is nothing
    left to move (no new plan)."""
    a, _, _ = fragmented

    def expire_it():
        finish_job(None, a.pk, succeeded=True)
        proposals.recheck_proposals(rack_ids=[Node.objects.get(pk=min(_destination(plan))).rack_id])

    before = nodes_of(a.pk)
    events = _action_events_during(operator, expire_it, plan.pk, ActionState.EXPIRED)

    plan.refresh_from_db()
    assert before and plan.state == ActionState.EXPIRED
    assert "no longer" in plan.error or "holds no GPUs" in plan.error
    assert "no new plan" in plan.error
    assert events[-1]["error"] == plan.error, "the live event carries the reason"
    client = Client()
    client.force_login(operator)
    card = client.get(f"/actions/{plan.pk}/fragment/").content.decode()
    assert f"Expired: {plan.error}" in card.replace("&#x27;", "'").replace("&quot;", '"')
    assert "this plan meets it" not in card and "not met: the plan expired" in card
    api = client.get(f"/api/actions/{plan.pk}/").json()
    assert api["error"] == plan.error and api["state"] == ActionState.EXPIRED


def _action_events_during(user, change, action_id: int, state: str) -> list[dict]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    headers = [
        (b"origin", b"http://localhost"),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]

    async def run() -> list[dict]:
        communicator = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await communicator.receive_json_from(timeout=5)  # hello
        await database_sync_to_async(change)()
        seen = []
        while True:
            event = await communicator.receive_json_from(timeout=10)
            if event["type"] == "action":
                seen.append(event["action"])
                if event["action"]["id"] == action_id and event["action"]["state"] == state:
                    break
        await communicator.disconnect()
        return seen

    return run_socket_test(run)
