"""The Action aggregate's lifecycle: the one place an action is created or
changes state. Other services ask :func:`transition`; they never write
``Action.state`` themselves, so every end of an action (approved, rejected,
expired, cancelled, succeeded, failed) gets the same check, audit record, live
event, webhook and settling of its jobs.

Allowed transitions::

    (new)     -> proposed | approved | executing        create()
    proposed  -> approved | rejected | expired | cancelled
    approved  -> executing | expired | cancelled
    executing -> succeeded | failed | cancelled

What follows each move, in the same transaction (sends happen on commit):

=========== ================ ==================== ===========================================
to          audit            webhook              then
=========== ================ ==================== ===========================================
approved    action.approve   action.approved      a worker executes it
rejected    action.reject    action.finished      a refused preemption/migration requeues
expired     action.expire    action.finished      jobs settled; the decision is made again
cancelled   action.cancel    action.finished      jobs settled
executing   action.execute   --                   --
succeeded   action.succeeded action.finished      a scheduling pass (not after a placement)
failed      action.failed    action.finished      jobs settled
=========== ================ ==================== ===========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet import events
from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action
from fleet.services import audit, dispatch, webhooks
from fleet.services import jobs as job_services
from fleet.services.errors import Conflict

S = ActionState

TRANSITIONS: dict[str, tuple[str, ...]] = {
    S.PROPOSED: (S.APPROVED, S.REJECTED, S.EXPIRED, S.CANCELLED),
    S.APPROVED: (S.EXECUTING, S.EXPIRED, S.CANCELLED),
    S.EXECUTING: (S.SUCCEEDED, S.FAILED, S.CANCELLED),
}
# States an action may be created in: executing when the caller already did its
# first steps (the scheduler allocates inline), approved when the policy says auto.
INITIAL_STATES = (S.PROPOSED, S.APPROVED, S.EXECUTING)
ENDED_STATES = (S.REJECTED, S.EXPIRED, S.CANCELLED, S.SUCCEEDED, S.FAILED)
# Ends that may leave jobs between steps (or waiting on a plan that will not run).
SETTLING_STATES = (S.EXPIRED, S.CANCELLED, S.FAILED)

AUDIT_ACTION: dict[str, str] = {
    S.APPROVED: "action.approve",
    S.REJECTED: "action.reject",
    S.EXPIRED: "action.expire",
    S.CANCELLED: "action.cancel",
    S.EXECUTING: "action.execute",
    S.SUCCEEDED: "action.succeeded",
    S.FAILED: "action.failed",
}
WEBHOOK_EVENT: dict[str, str | None] = {
    S.APPROVED: "action.approved",
    S.EXECUTING: None,
    **{state: "action.finished" for state in ENDED_STATES},
}
RECOVERY_KINDS = (ActionKind.RECOVERY, ActionKind.PREEMPTION, ActionKind.MIGRATION, ActionKind.REQUEUE)


def snapshot(action: Action) -> dict[str, Any]:
    return {"state": action.state, "step_index": action.step_index}


def allowed_from(to_state: str) -> tuple[str, ...]:
    """The states an action may move to ``to_state`` from."""
    return tuple(s for s, targets in TRANSITIONS.items() if to_state in targets)


def create(rows: list[Action], jobs: Sequence[Sequence[int]], actor=None) -> list[Action]:
    """Insert new actions (unsaved rows, one list of job ids each) in one
    transaction: audited, announced, and those not waiting for an operator
    handed to a worker on commit."""
    for row in rows:
        if row.state not in INITIAL_STATES:
            raise ValueError(f"an action cannot be created {row.state}")
    with transaction.atomic():
        actions = Action.objects.bulk_create(rows)
        Action.jobs.through.objects.bulk_create(
            Action.jobs.through(action_id=a.pk, job_id=j) for a, ids in zip(actions, jobs, strict=True) for j in ids
        )
        audit.record_many(
            actor,
            "action.propose",
            [
                (a, None, {"kind": a.kind, "state": a.state, "steps": len(a.steps), "cost_gpu_hours": a.cost_gpu_hours}, a.title)
                for a in actions
            ],
        )
        for a in actions:
            if a.state != S.PROPOSED:
                dispatch.execute_soon(a.pk)
        pairs = list(zip(actions, jobs, strict=True))
        webhooks.emit_many("action.proposed", (webhooks.action_data(a, ids) for a, ids in pairs))
        # Kinds the policy runs automatically are approved as they are proposed.
        approved_now = ((a, ids) for a, ids in pairs if a.state != S.PROPOSED)
        webhooks.emit_many("action.approved", (webhooks.action_data(a, ids) for a, ids in approved_now))
        events.actions_changed(a.pk for a in actions)
    return actions


def transition(
    actor,
    action_id: int,
    to_state: str,
    *,
    message: str = "",
    fields: dict[str, Any] | None = None,
    log: str = "",
    expect: Sequence[str] | None = None,
    quiet: bool = False,
    replan: bool = True,
    now: datetime | None = None,
) -> Action | None:
    """Move action ``action_id`` to ``to_state``.

    1. Lock the row and check the move against :data:`TRANSITIONS` (and, if
       given, that the action is in one of ``expect``). A refused move raises
       Conflict, or returns None with ``quiet`` (a redelivered task racing a
       twin: someone else got there first).
    2. Apply it with ``fields``; an end sets ``finished_at``, executing sets
       ``started_at``; ``log`` is appended to the action's log.
    3. Audit it, publish the live event and record the webhook (both go out
       only if the transaction commits).
    4. Do what follows (see the module table); ``replan=False`` when the caller
       makes the new decision itself, right away.
    """
    now = now or timezone.now()
    with transaction.atomic():
        action = Action.objects.select_for_update().get(pk=action_id)
        sources = allowed_from(to_state)
        if expect is not None:
            sources = tuple(s for s in sources if s in expect)
        if action.state not in sources:
            if quiet:
                return None
            names = " or ".join(str(s) for s in sources) or "no state"
            raise Conflict(f"action #{action_id} is {action.state}; it can become {to_state} only from {names}")
        # Where it was in its steps matters only once it has started.
        before = snapshot(action) if action.state == S.EXECUTING else {"state": action.state}
        action.state = to_state
        for name, value in (fields or {}).items():
            setattr(action, name, value)
        if to_state in ENDED_STATES and action.finished_at is None:
            action.finished_at = now
        if to_state == S.EXECUTING and action.started_at is None:
            action.started_at = now
        if log:
            action.log = [*action.log, {"at": now.isoformat(), "message": log}]
        action.save()
        audit.record(actor, AUDIT_ACTION[to_state], action, before=before, after=snapshot(action), message=message[:500])
        events.actions_changed([action.pk])
        if WEBHOOK_EVENT[to_state]:
            webhooks.emit(WEBHOOK_EVENT[to_state], webhooks.action_finished(action))
        _then(actor, action, replan=replan)
    return action


def _then(actor, action: Action, *, replan: bool) -> None:
    state = action.state
    if state == S.APPROVED:
        dispatch.execute_soon(action.pk)
    elif state == S.REJECTED and action.kind in (ActionKind.PREEMPTION, ActionKind.MIGRATION):
        # A refused preemption or migration leaves the job no way to recover in
        # place, so it goes back to the queue.
        for job in action.jobs.filter(state=JobState.RECOVERING):
            job_services.requeue_job(actor, job.pk, reason=f"recovery #{action.pk} rejected; requeued")
    elif state == S.SUCCEEDED and action.kind not in (ActionKind.PLACEMENT, ActionKind.PLACEMENT_SPILL):
        # Recoveries, moves and drains change what is free; placements don't.
        dispatch.schedule_soon()
    if state in SETTLING_STATES:
        settle_jobs(action, actor, replan=replan)
        if state == S.EXPIRED and action.kind == ActionKind.DEFRAG and replan:
            dispatch.after_commit("fleet.tasks.plan_defrag")


def settle_jobs(action: Action, actor, *, replan: bool = True) -> None:
    """After an action ends early, leave no job stranded between steps:
    a job placed but never started goes back to the queue, a job still
    recovering gets a new recovery decision, and the queue gets a pass."""
    for job in action.jobs.all():
        if job.state == JobState.PLACED:
            job_services.requeue_job(actor, job.pk, reason=f"action #{action.pk} ended before the job started")
        elif job.state == JobState.RECOVERING and replan:
            dispatch.recover_soon(job.pk)
    dispatch.schedule_soon()
