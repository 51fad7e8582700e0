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
    executing -> expired                                 only before its first step is done

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

A ``reclaim`` (preemption to start a job, :mod:`fleet.services.decisions.admission`)
also sends ``reclaim.proposed`` when it is created and ``reclaim.finished`` when
it ends, with the job, its tenant, the victims and the GPU-hours.

Holds. A plan that moves jobs (:data:`HOLD_KINDS`: defrag plans, migrations,
recoveries and preemptions)
holds the nodes it empties and the nodes it fills (``NodeHold`` rows) from its
approval to its end, so that the scheduler, recovery and other plans leave them
alone while it runs (the engine sees a held node as taking no new work:
``fleet.engine.engine_health``). The holds are taken in the transaction that
approves the action (created approved, or moved to approved) and released in
the one that ends it, whatever the end: nothing else writes them, and a worker
that dies mid-plan leaves the action executing with its holds, to be carried on
by reconcile. Both are audited (``action.hold``, ``action.release``) and move
the held racks' versions, so the live fleets and the console see them. The
jobs such a plan moves are held for it too, as the jobs of every open action
are (``actions.open_action_job_ids``): the scheduler never places them again
while the plan runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from fleet import dispatch, events
from fleet import steps as st
from fleet.choices import ActionKind, ActionState, JobState, NodeState
from fleet.models import Action, Allocation, HoldRole, Node, NodeHold
from fleet.services import audit, webhooks
from fleet.services.errors import Conflict
from fleet.services.jobs import allocations as job_allocations
from fleet.services.racks import bump_versions

S = ActionState

TRANSITIONS: dict[str, tuple[str, ...]] = {
    S.PROPOSED: (S.APPROVED, S.REJECTED, S.EXPIRED, S.CANCELLED),
    S.APPROVED: (S.EXECUTING, S.EXPIRED, S.CANCELLED),
    # executing -> expired: the re-check before its first step found the plan
    # stale (a worker that claimed it and died before that step); nothing was done.
    S.EXECUTING: (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.EXPIRED),
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
# Plans that stop jobs and place them again, or swap a job onto other nodes:
# they hold the nodes they empty and fill from approval to end (see the module
# docstring). A preemption holds the node its victim frees until its swap.
HOLD_KINDS = (
    ActionKind.DEFRAG,
    ActionKind.EVACUATION,
    ActionKind.MIGRATION,
    ActionKind.PREEMPTION,
    ActionKind.RECOVERY,
    ActionKind.RECLAIM,
)
# Steps that release a job's GPUs (the nodes it leaves are emptied by the plan).
RELEASE_OPS = (st.Stop.op, st.Preempt.op, st.Requeue.op)


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
            Action.jobs.through(action_id=a.pk, job_id=j)
            for a, ids in zip(actions, jobs, strict=True)
            for j in ids
        )
        audit.record_many(
            actor,
            "action.propose",
            [
                (
                    a,
                    None,
                    {
                        "kind": a.kind,
                        "state": a.state,
                        "steps": len(a.steps),
                        "cost_gpu_hours": a.cost_gpu_hours,
                    },
                    a.title,
                )
                for a in actions
            ],
        )
        for a in actions:
            if a.state == S.APPROVED and a.kind in HOLD_KINDS:
                take_holds(actor, a)
            if a.state != S.PROPOSED:
                dispatch.execute_soon(a.pk)
        pairs = list(zip(actions, jobs, strict=True))
        webhooks.emit_many("action.proposed", (webhooks.action_data(a, ids) for a, ids in pairs))
        # Kinds the policy runs automatically are approved as they are proposed.
        approved_now = ((a, ids) for a, ids in pairs if a.state != S.PROPOSED)
        webhooks.emit_many("action.approved", (webhooks.action_data(a, ids) for a, ids in approved_now))
        reclaims = ((a, ids) for a, ids in pairs if a.kind == ActionKind.RECLAIM)
        webhooks.emit_many("reclaim.proposed", (webhooks.reclaim_data(a, ids) for a, ids in reclaims))
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
        if action.state == S.EXECUTING and to_state == S.EXPIRED and action.step_index > 0:
            sources = tuple(
                s for s in sources if s != S.EXECUTING
            )  # it has started: it ends, it does not expire
        if action.state not in sources:
            if quiet:
                return None
            names = " or ".join(str(s) for s in sources) or "no state"
            raise Conflict(
                f"action #{action_id} is {action.state}; it can become {to_state} only from {names}"
            )
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
        if to_state in ENDED_STATES and action.kind in HOLD_KINDS and action.lost_gpu_hours is None:
            action.lost_gpu_hours = round(lost_so_far(action), 4)
        action.save()
        audit.record(
            actor,
            AUDIT_ACTION[to_state],
            action,
            before=before,
            after=snapshot(action),
            message=message[:500],
        )
        if action.kind in HOLD_KINDS:
            if to_state == S.APPROVED:
                take_holds(actor, action)
            elif to_state in ENDED_STATES:
                release_holds(actor, action)
        events.actions_changed([action.pk])
        event = WEBHOOK_EVENT[to_state]
        if event:
            webhooks.emit(event, webhooks.action_finished(action))
        if to_state in ENDED_STATES and action.kind == ActionKind.RECLAIM:
            webhooks.emit("reclaim.finished", lambda: webhooks.reclaim_data(action))
        _then(actor, action, replan=replan)
    return action


def step_progress(action: Action, index: int, done: float) -> None:
    """The cluster adapter's report from inside step ``index`` of an executing
    action: ``done`` of it (0 to 1). Not a move: the progress bar and when the
    step was last heard of (a webhook step's timeout counts from it), with the
    live event; nothing if the action moved past that step meanwhile."""
    total = max(1, len(action.steps))
    done = min(1.0, max(0.0, done))
    changed = Action.objects.filter(pk=action.pk, state=S.EXECUTING, step_index=index).update(
        progress=(index + done) / total, step_started_at=timezone.now()
    )
    if changed:
        events.actions_changed([action.pk])


def _then(actor, action: Action, *, replan: bool) -> None:
    state = action.state
    if state == S.APPROVED:
        dispatch.execute_soon(action.pk)
    elif state == S.REJECTED and action.kind in (ActionKind.PREEMPTION, ActionKind.MIGRATION):
        # A refused preemption or migration leaves the job no way to recover in
        # place, so it goes back to the queue.
        for job in action.jobs.filter(state=JobState.RECOVERING):
            job_allocations.requeue_job(actor, job.pk, reason=f"recovery #{action.pk} rejected; requeued")
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
    recovering gets a new recovery decision, and the queue gets a pass.

    A plan that moves jobs and ended before its first step (an expired or
    rejected proposal, an approval re-planned) changed nothing and frees
    nothing the scheduler could use: no pass. One made on its heels would fill
    the new plan's destinations before anyone could approve it."""
    touched = False
    for job in action.jobs.all():
        if job.state == JobState.PLACED:
            job_allocations.requeue_job(
                actor, job.pk, reason=f"action #{action.pk} ended before the job started"
            )
            touched = True
        elif job.state == JobState.RECOVERING and replan:
            dispatch.recover_soon(job.pk)
            touched = True
    if touched or action.kind not in HOLD_KINDS or action.step_index > 0 or action.decided_at is not None:
        dispatch.schedule_soon()


# --- holds ----------------------------------------------------------------------------


def hold_plan(action: Action) -> dict[int, str]:
    """The nodes the action's remaining steps empty and fill, as node id -> role.

    1. Filled: where it allocates, and the replacements it swaps a job onto.
    2. Emptied: where the jobs it stops run now; and in a rack it clears (jobs
       leave it, none come in), its idle healthy nodes too: the room it makes
       there is what it is for, and work placed there meanwhile would leave the
       plan carried out for nothing (the gang it makes room for still waiting).
    """
    empties: set[int] = set()
    fills: set[int] = set()
    released: set[int] = set()
    for data in action.steps[action.step_index :]:
        try:
            step = st.Step.from_dict(data)
        except st.StepError:
            continue
        if step.op in RELEASE_OPS and step.job is not None:
            released.add(step.job)
        elif isinstance(step, st.Allocate):
            fills.update(int(n) for n in step.nodes)
        elif isinstance(step, st.Swap):
            fills.update(int(n) for n in step.swaps.values())
    if released:
        empties = set(
            Allocation.objects.filter(job_id__in=released, released_at__isnull=True).values_list(
                "gpu__node_id", flat=True
            )
        )
        racks = dict(Node.objects.filter(pk__in=empties | fills).values_list("pk", "rack_id"))
        cleared = {racks[n] for n in empties} - {racks[n] for n in fills}
        if cleared:
            busy = Allocation.objects.filter(released_at__isnull=True, gpu__node_id=OuterRef("pk"))
            empties |= set(
                Node.objects.filter(rack_id__in=cleared, state=NodeState.HEALTHY)
                .exclude(Exists(busy))
                .values_list("pk", flat=True)
            )
    return {n: HoldRole.FILL if n in fills else HoldRole.EMPTY for n in empties | fills}


def take_holds(actor, action: Action) -> list[int]:
    """Hold the nodes of :func:`hold_plan` for ``action`` (in the caller's
    transaction). Conflict, and nothing held, if another plan holds one of
    them: two plans never count on the same node (the table's primary key)."""
    nodes = hold_plan(action)
    if not nodes:
        return []
    try:
        # A savepoint: the IntegrityError leaves the caller's transaction usable.
        with transaction.atomic():
            NodeHold.objects.bulk_create(
                NodeHold(node_id=n, action_id=action.pk, role=role) for n, role in sorted(nodes.items())
            )
    except IntegrityError as exc:
        other = (
            NodeHold.objects.select_related("node")
            .filter(node_id__in=list(nodes))
            .exclude(action_id=action.pk)
            .first()
        )
        where = (
            f"node {other.node.hostname} is already held for action #{other.action_id}"
            if other
            else "a node is already held"
        )
        raise Conflict(f"action #{action.pk} cannot hold its nodes: {where}") from exc
    rows = list(
        Node.objects.filter(pk__in=list(nodes)).order_by("hostname").values_list("hostname", "rack_id")
    )
    filled = sum(1 for role in nodes.values() if role == HoldRole.FILL)
    audit.record(
        actor,
        "action.hold",
        action,
        after={"nodes": len(nodes), "emptied": len(nodes) - filled, "filled": filled},
        message=("holds " + ", ".join(h for h, _ in rows))[:500],
    )
    bump_versions({rack for _, rack in rows})
    return sorted(nodes)


def release_holds(actor, action: Action) -> int:
    """Release every node held for ``action`` (in the caller's transaction);
    returns how many there were."""
    holds = NodeHold.objects.filter(action_id=action.pk)
    racks = set(holds.values_list("node__rack_id", flat=True))
    count = holds.delete()[0]
    if count:
        audit.record(
            actor,
            "action.release",
            action,
            before={"nodes": count},
            after={"nodes": 0},
            message=f"released {count} held node(s): the action is {action.state}",
        )
        bump_versions(racks)
    return count


def release_stale_holds() -> list[int]:
    """Holds whose action is no longer approved or executing (drift: a write
    outside the lifecycle). Released, each through its action; returns the
    actions' ids. Reconcile's safety net; the lifecycle leaves none."""
    stale = sorted(
        set(
            NodeHold.objects.exclude(action__state__in=(S.APPROVED, S.EXECUTING)).values_list(
                "action_id", flat=True
            )
        )
    )
    for action_id in stale:
        with transaction.atomic():
            action = Action.objects.select_for_update().get(pk=action_id)
            if action.state not in (S.APPROVED, S.EXECUTING):
                release_holds(None, action)
    return stale


def stop_costs(action: Action) -> list[tuple[int, float]]:
    """(step index, GPU-hours) of each step that stops a job: the work it loses
    (back to its last checkpoint, and the restart), from the engine's plan. A
    defrag plan's n-th stop of a job is that job's n-th move."""
    stops = [
        (i, int(s.get("job") or 0))
        for i, s in enumerate(action.steps)
        if isinstance(s, dict) and s.get("op") in RELEASE_OPS
    ]
    if not stops:
        return []
    moves = (action.plan.get("engine") or {}).get("moves") or []
    by_job: dict[int, list[float]] = {}
    for move in moves:
        try:
            by_job.setdefault(int(move["job_id"]), []).append(float(move["cost_gpu_hours"]))
        except (KeyError, TypeError, ValueError):
            continue
    even = action.cost_gpu_hours / len(stops)
    out = []
    for index, job in stops:
        costs = by_job.get(job)
        out.append((index, costs.pop(0) if costs else even))
    return out


def lost_so_far(action: Action) -> float:
    """The GPU-hours the steps done so far cost: every job stopped lost its work
    since its last checkpoint and pays a restart, wherever it runs again. A
    step skipped (its job had ended) stopped nothing."""
    skipped = {entry.get("step") for entry in action.log if entry.get("status") == "skipped"}
    return sum(
        cost for index, cost in stop_costs(action) if index < action.step_index and index not in skipped
    )
