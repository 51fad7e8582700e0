"""Proposals waiting for an operator are re-decided when the fleet makes them
obsolete: a recovery preemption gives way to a restart in place when the failed
node returns, or to a swap when a spare frees up in the rack; a superseded
defrag plan ends like any action (live event, webhook, audit); the periodic
recheck catches a stale proposal. Every expiry goes through the one Action
lifecycle."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from fleet import engine
from fleet.choices import ActionKind, ActionState, JobState, WebhookEvent
from fleet.models import Action, AuditEvent, Job, Node, WebhookDelivery
from fleet.services.actions import lifecycle as action_lifecycle
from fleet.services.actions import propose as action_services
from fleet.services.decisions import defrag as defrag_services
from fleet.services.decisions import recheck as proposals
from fleet.services.decisions.recovery import plan_recovery
from fleet.services.errors import Conflict
from fleet.services.jobs.allocations import apply_placement, finish_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from rackwise.asgi import application
from tests.sockets import run_socket_test
from tests.support import carry_out, nodes_of, wait_for, workers
from tests.webhook_receiver import subscribe

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
def full_rack(fleet, submitter):
    """Rack r1 is full: a 16-node training job and a preemptible 2-node job on
    its spares. r2 is empty, so the engine has choices."""
    r1, _ = fleet
    train = _run(submitter, r1, range(16), name="train", priority=10, preemptible=False)
    filler = _run(submitter, r1, range(16, 18), name="filler", priority=0, preemptible=True)
    return train, filler


def _preemption_waiting(operator, train: Job) -> tuple[Action, Node]:
    """Fail a node under the training job; with no free node in its rack the
    recovery preempts the filler, which waits for an operator."""
    victim = Node.objects.get(pk=min(nodes_of(train.pk)))
    node_services.mark_node_failed(operator, victim.pk, "XID 79")
    action = plan_recovery(train.pk)
    assert action is not None and (action.kind, action.state) == (ActionKind.PREEMPTION, ActionState.PROPOSED)
    return action, victim


def _headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [
        (b"origin", b"http://localhost"),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]


def _action_events_during(user, change, action_id: int, state: str) -> list[dict]:
    """Run ``change`` with an operator's live feed open; return the feed's action
    events up to the one showing ``action_id`` in ``state``."""
    headers = _headers(user)

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


def _finished_deliveries(action_id: int) -> list[dict]:
    return [
        d.payload["data"]["action"]
        for d in WebhookDelivery.objects.filter(event_type=WebhookEvent.ACTION_FINISHED).order_by("id")
        if d.payload["data"]["action"]["id"] == action_id
    ]


# --- a waiting recovery gives way when the fleet makes it obsolete -------------------


def test_a_waiting_preemption_expires_and_the_job_restarts_in_place_when_its_failed_node_returns(
    full_rack, operator, receiver
):
    train, filler = full_rack
    subscribe(operator, receiver, WebhookEvent.ACTION_FINISHED)
    preemption, failed = _preemption_waiting(operator, train)
    before = nodes_of(train.pk)

    def node_returns():
        node_services.return_node_to_service(operator, failed.pk, "reseated")
        proposals.recheck_proposals(rack_ids=[failed.rack_id])

    events = _action_events_during(operator, node_returns, preemption.pk, ActionState.EXPIRED)

    preemption.refresh_from_db()
    assert preemption.state == ActionState.EXPIRED
    assert "superseded by a better plan" in preemption.error
    assert events[-1]["state"] == ActionState.EXPIRED
    (delivery,) = _finished_deliveries(preemption.pk)
    assert delivery["state"] == ActionState.EXPIRED
    expiry = AuditEvent.objects.get(action="action.expire", object_id=str(preemption.pk))
    assert (expiry.before, expiry.after["state"]) == ({"state": "proposed"}, "expired")

    restart = Action.objects.get(jobs=train.pk, kind=ActionKind.RECOVERY)
    assert restart.state == ActionState.APPROVED, "a restart in place runs without an operator"
    assert [s["op"] for s in restart.steps] == ["restart"]
    carry_out(restart.pk)
    train.refresh_from_db()
    filler.refresh_from_db()
    assert (train.state, train.attempt) == (JobState.RUNNING, 2)
    assert nodes_of(train.pk) == before, "it restarts on the same nodes"
    assert filler.state == JobState.RUNNING, "nobody was preempted"


def test_a_waiting_preemption_expires_and_the_job_takes_the_spare_that_freed_up_in_its_rack(
    full_rack, operator, receiver
):
    train, filler = full_rack
    subscribe(operator, receiver, WebhookEvent.ACTION_FINISHED)
    preemption, failed = _preemption_waiting(operator, train)
    freed = nodes_of(filler.pk)

    def filler_ends():
        finish_job(None, filler.pk, succeeded=True, reason="done")
        proposals.recheck_proposals(rack_ids=[failed.rack_id])

    events = _action_events_during(operator, filler_ends, preemption.pk, ActionState.EXPIRED)

    preemption.refresh_from_db()
    assert preemption.state == ActionState.EXPIRED
    assert "holds no GPUs" in preemption.error, "its victim is gone, so the plan no longer holds"
    assert events[-1]["state"] == ActionState.EXPIRED
    assert [d["state"] for d in _finished_deliveries(preemption.pk)] == [ActionState.EXPIRED]
    assert AuditEvent.objects.filter(action="action.expire", object_id=str(preemption.pk)).exists()

    swap = Action.objects.get(jobs=train.pk, kind=ActionKind.RECOVERY)
    assert [s["op"] for s in swap.steps] == ["swap", "restart"]
    carry_out(swap.pk)
    train.refresh_from_db()
    assert (train.state, train.attempt) == (JobState.RUNNING, 2)
    after = nodes_of(train.pk)
    assert failed.pk not in after and len(after & freed) == 1, "the failed node is swapped for a freed spare"


def test_a_node_returning_in_its_rack_is_enough_for_the_workers_to_re_decide(
    full_rack, operator, operator_client
):
    """End to end with a real worker: the rack change itself asks for the recheck."""
    train, _ = full_rack
    with workers(1):
        failed = min(nodes_of(train.pk))
        assert (
            operator_client.post(
                f"/api/nodes/{failed}/mark-failed/", {"reason": "XID 79", "confirm": True}, format="json"
            ).status_code
            == 200
        )
        preemption = wait_for(
            lambda: Action.objects.filter(
                jobs=train.pk, kind=ActionKind.PREEMPTION, state=ActionState.PROPOSED
            ).first(),
            30,
            "the preemption proposal",
        )
        assert (
            operator_client.post(f"/api/nodes/{failed}/return-to-service/", {}, format="json").status_code
            == 200
        )
        wait_for(
            lambda: Job.objects.filter(pk=train.pk, state=JobState.RUNNING, attempt=2).exists(),
            30,
            "the restart",
        )
    preemption.refresh_from_db()
    assert preemption.state == ActionState.EXPIRED


def test_a_proposal_that_still_holds_is_left_waiting(full_rack, operator):
    train, _ = full_rack
    preemption, failed = _preemption_waiting(operator, train)
    result = proposals.recheck_proposals(rack_ids=[failed.rack_id])
    preemption.refresh_from_db()
    assert result.checked == [preemption.pk] and result.expired == []
    assert preemption.state == ActionState.PROPOSED and preemption.checked_at is not None


def test_a_recheck_after_a_rack_change_plans_on_the_in_memory_fleet_and_leaves_it_as_it_was(
    full_rack, operator, settings
):
    """No full load per proposal (0.5 s at 1,000 racks): the plan's steps (here
    the filler's preemption) and the fresh recovery plan are tried in a trial on
    the fleet the scheduler keeps, brought up to date from the changed rack."""
    settings.RACKWISE_LIVE_FLEET_VERIFY = False  # verify itself loads the rows
    train, filler = full_rack
    preemption, failed = _preemption_waiting(operator, train)
    live = engine._live
    with engine.live_snapshot() as snap:
        before = engine.canonical(snap.fleet)
    node_services.drain_node(operator, Node.objects.get(rack=failed.rack_id, slot=17).pk, "test")
    result = proposals.recheck_proposals(rack_ids=[failed.rack_id])
    assert result.checked == [preemption.pk]
    assert engine._live is live and live.rebuilds == 1 and live.applied >= 1
    with engine.live_snapshot() as snap:
        assert str(filler.pk) in snap.fleet.allocations, "the trial put the preempted job back"
        engine.verify(snap)
        assert engine.canonical(snap.fleet) != before  # the drained node, nothing else


# --- a superseded defrag plan ends loudly --------------------------------------------


def test_a_superseded_defrag_plan_expires_with_a_live_event_a_webhook_and_an_audit_entry(
    fragmented, operator, receiver
):
    subscribe(operator, receiver, WebhookEvent.ACTION_FINISHED)
    first = defrag_services.plan_defrag(operator).action
    assert first is not None and first.state == ActionState.PROPOSED

    holder: dict = {}

    def replan():
        holder["second"] = defrag_services.plan_defrag(operator).action

    events = _action_events_during(operator, replan, first.pk, ActionState.EXPIRED)

    first.refresh_from_db()
    assert first.state == ActionState.EXPIRED and "superseded by a new plan requested by olga" in first.error
    assert events[-1]["id"] == first.pk
    assert [d["state"] for d in _finished_deliveries(first.pk)] == [ActionState.EXPIRED]
    expiry = AuditEvent.objects.get(action="action.expire", object_id=str(first.pk))
    assert expiry.actor == operator
    assert holder["second"].state == ActionState.PROPOSED and holder["second"].pk != first.pk


# --- the periodic recheck -------------------------------------------------------------


def test_the_periodic_recheck_re_plans_a_stale_proposal_and_leaves_a_fresh_one(full_rack, operator):
    train, _ = full_rack
    preemption, failed = _preemption_waiting(operator, train)
    # The node comes back through a path that announces nothing (as an edit in
    # the admin might): only the periodic recheck can notice.
    Node.objects.filter(pk=failed.pk).update(state="healthy")
    from fleet.models import GPU

    GPU.objects.filter(node=failed).update(health="ok")

    soon = preemption.created_at + timedelta(seconds=settings.RACKWISE_PROPOSAL_RECHECK_S - 1)
    assert proposals.recheck_proposals(now=soon).checked == [], "not stale yet"
    preemption.refresh_from_db()
    assert preemption.state == ActionState.PROPOSED

    later = preemption.created_at + timedelta(seconds=settings.RACKWISE_PROPOSAL_RECHECK_S)
    result = proposals.recheck_proposals(now=later)
    preemption.refresh_from_db()
    assert result.expired == [preemption.pk]
    assert preemption.state == ActionState.EXPIRED and preemption.finished_at == later
    (restart,) = Action.objects.filter(pk__in=result.proposed)
    assert restart.kind == ActionKind.RECOVERY and [s["op"] for s in restart.steps] == ["restart"]


def test_the_recheck_is_scheduled_at_least_as_often_as_the_setting_says():
    from fleet.schedules import DEFAULT_SCHEDULES

    task, every = DEFAULT_SCHEDULES["proposal recheck"]
    assert task == "fleet.tasks.recheck_proposals"
    assert every <= settings.RACKWISE_PROPOSAL_RECHECK_S


# --- the lifecycle's table ------------------------------------------------------------


def test_it_refuses_a_transition_the_table_does_not_allow(full_rack, operator):
    train, _ = full_rack
    preemption, _ = _preemption_waiting(operator, train)
    with pytest.raises(Conflict, match="is proposed; it can become succeeded only from executing"):
        action_lifecycle.transition(None, preemption.pk, ActionState.SUCCEEDED)
    action_services.reject(operator, preemption.pk, "no")
    with pytest.raises(Conflict, match="is rejected; it can become expired only from proposed or approved"):
        action_lifecycle.transition(None, preemption.pk, ActionState.EXPIRED)
    assert action_services.expire(None, preemption.pk, ["late"]) is None, (
        "a task racing a decision does nothing"
    )
