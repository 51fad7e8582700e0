"""Celery tasks. Each takes ids, re-reads the rows, and returns early when there
is nothing to do, so a redelivered or duplicated message is harmless; all run
with acks_late (a task killed mid-way is delivered again). Tasks only call
services."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

from celery import Task, shared_task
from celery.signals import task_prerun
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.models import Q
from django.utils import timezone

from fleet import dispatch, locks
from fleet.choices import ActionState, JobState
from fleet.models import Action, Job
from fleet.services import audit
from fleet.services.actions import lifecycle as action_lifecycle
from fleet.services.actions import propose as action_services
from fleet.services.decisions import defrag as defrag_services
from fleet.services.decisions import evacuation, scheduling
from fleet.services.decisions import recheck as proposals
from fleet.services.decisions import recovery as recovery_services
from fleet.services.errors import Conflict
from fleet.services.execution import cluster_sync
from fleet.services.execution import execute as execution
from fleet.services.intake import health
from fleet.services.intake.demo import tick
from fleet.services.jobs import allocations as job_allocations
from fleet.services.nodes import lifecycle as node_lifecycle
from fleet.services.read import read_models
from fleet.services.read.metrics import record_sample
from fleet.services.webhooks import SWEEP_NUDGE_S, attempt_delivery, due_deliveries

log = logging.getLogger(__name__)


class RetriedOnDatabaseErrors(Task):
    """A task that meets a dropped database connection (a PostgreSQL restart or
    failover, a proxy that cut it) is run again shortly, on a fresh connection,
    instead of failing and waiting for reconcile (which started jobs 69-90 s
    late): 1, 2, 4 ... s, at most 30 s apart, up to 8 times. Every task is
    idempotent (module docstring), so a second run is harmless."""

    max_retries = 8

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            for connection in connections.all(initialized_only=True):
                connection.close_if_unusable_or_obsolete()
            log.warning("%s: database error, run again shortly: %s", self.name, exc)
            raise self.retry(exc=exc, countdown=min(30, 2**self.request.retries)) from exc


TASK_OPTIONS = {"acks_late": True, "ignore_result": True, "base": RetriedOnDatabaseErrors}


@task_prerun.connect
def _tag_audit_events(task_id: str | None = None, **_kwargs) -> None:
    """Group the audit events one task run writes, as a request's are."""
    try:
        audit.current_request_id.set(uuid.UUID(task_id) if task_id else None)
    except ValueError:
        audit.current_request_id.set(None)


@shared_task(name="fleet.tasks.schedule_pending", **TASK_OPTIONS)
def schedule_pending() -> str:
    """One scheduling pass at a time fleet-wide. A request that arrives while a
    pass runs marks the queue dirty; the running pass goes round again. The
    decision lock is a renewed lease: a pass that loses it stops before its next
    commit, and leaves the queue dirty for whoever holds the lock now.

    A request that finds the lock held waits up to one lease for it: a holder
    whose host was cut off or that was killed never comes round again, and its
    lease lapses within that time, so the next decision does not wait for
    beat's tick (or for a message a cut-off worker took from the queue and will
    never run). A live holder soon releases it; the dirty queue it cleared needs
    no pass then."""
    r = locks.client()
    r.set(locks.SCHEDULE_DIRTY, 1)
    passes = 0
    while r.get(locks.SCHEDULE_DIRTY):
        try:
            with locks.decisions(wait=settings.RACKWISE_DECISION_LOCK_TTL_S + 1) as lease:
                while r.getdel(locks.SCHEDULE_DIRTY):
                    try:
                        result = scheduling.schedule_pass(checkpoint=lease.checkpoint)
                    except locks.LockLost:
                        r.set(locks.SCHEDULE_DIRTY, 1)
                        log.warning("scheduling pass stopped: the decision lock was lost")
                        return f"{passes} pass(es); stopped: the decision lock was lost"
                    passes += 1
                    if result.placed or result.proposed:
                        log.info("scheduling pass: placed %s, proposed %s", result.placed, result.proposed)
        except locks.Busy:
            return "another worker holds the decision lock; it will see the queue is dirty"
    return f"{passes} pass(es)"


@shared_task(name="fleet.tasks.recover_job", **TASK_OPTIONS)
def recover_job(job_id: int) -> str:
    dispatch.taken("fleet.tasks.recover_job", job_id)
    with locks.decisions():
        action = recovery_services.plan_recovery(job_id)
    return f"proposed action #{action.pk}" if action else "nothing to do"


@shared_task(name="fleet.tasks.recheck_proposals", **TASK_OPTIONS)
def recheck_proposals(rack_ids: list[int] | None = None) -> str:
    """Re-decide proposals the fleet made obsolete: those waiting on ``rack_ids``
    (a node there changed) and any not checked for RACKWISE_PROPOSAL_RECHECK_S."""
    with locks.decisions() as lease:
        result = proposals.recheck_proposals(rack_ids=rack_ids, checkpoint=lease.checkpoint)
    return f"checked {result.checked}, expired {result.expired}, proposed {result.proposed}"


@shared_task(name="fleet.tasks.plan_defrag", **TASK_OPTIONS)
def plan_defrag(**goal) -> str:
    """Plan a defrag for ``goal`` (the fields of ``DefragGoal``; none: room for the pending gangs)."""
    with locks.decisions():
        outcome = defrag_services.plan_defrag(None, defrag_services.DefragGoal(**goal))
    return f"action #{outcome.action.pk}" if outcome.action else outcome.reason


@shared_task(name="fleet.tasks.plan_evacuations", **TASK_OPTIONS)
def plan_evacuations() -> str:
    """A rack's NVLink fabric changed, or a health rule drained a node: propose
    moving long jobs off them, and drop the proposals whose risk has gone."""
    with locks.decisions():
        actions = evacuation.propose_evacuations()
    return f"proposed {[a.pk for a in actions]}"


@shared_task(name="fleet.tasks.defrag_watch", **TASK_OPTIONS)
def defrag_watch() -> str:
    """Plan a defrag now, without waiting for the hourly run, when fragmentation
    or a required job's wait passes its threshold."""
    why = defrag_services.defrag_due()
    if why is None:
        return "not due"
    return f"{why}: {plan_defrag()}"


@shared_task(name="fleet.tasks.execute_action", **TASK_OPTIONS)
def execute_action(action_id: int) -> str:
    """Carry out an action step by step. The per-action lock keeps a duplicate
    delivery from running the same step twice at once; the step counter, moved
    under the row lock with the step's database change, makes each step count
    once. A step the cluster could not be reached for is tried again later
    (``retry_in``, the service's backoff), by this task re-sent with a countdown."""
    dispatch.taken("fleet.tasks.execute_action", action_id)
    try:
        with locks.action_lock(action_id) as lock:
            # The re-check before the first step may make the plan again and
            # take holds: a decision, so under the decision lock (the steps
            # themselves run without it). Busy: reconcile sends it again.
            begun = False
            if execution.needs_decision_to_begin(action_id):
                try:
                    # A short wait, well inside the action lock's TTL.
                    with locks.decisions(wait=settings.RACKWISE_STALL_S / 3):
                        not_started = execution.begin(action_id)
                except locks.Busy:
                    dispatch.send_once("fleet.tasks.execute_action", action_id, countdown=1)
                    return "the decision lock is busy; trying again shortly"
                if not_started is not None:
                    return not_started.message
                begun = True
            while True:
                result = execution.execute_next_step(action_id, begun=begun)
                begun = True
                if result.retry_in is not None:
                    dispatch.send_once("fleet.tasks.execute_action", action_id, countdown=result.retry_in)
                    return result.message
                if not result.more:
                    return result.message
                lock.extend(settings.RACKWISE_STALL_S, replace_ttl=True)
    except locks.Busy:
        # Another worker is in a step of it. This message may carry news that
        # one has not seen (a webhook callback arriving while the step that
        # posted it finishes): it is sent again shortly rather than dropped.
        dispatch.send_once("fleet.tasks.execute_action", action_id, countdown=1)
        return "another worker is executing it; trying again shortly"


@shared_task(name="fleet.tasks.sync_cluster", **TASK_OPTIONS)
def sync_cluster(asked_at: float | None = None) -> dict:
    """Apply what the cluster says (jobs that ended there); idempotent. Coalesced
    as scheduling passes are: one sync at a time fleet-wide, a request that
    comes while one runs has it go round again, and a request due at
    ``asked_at`` that a sync begun since has answered is skipped. A burst of
    job ends thus costs a few syncs, not one full sync each."""
    r = locks.client()
    if asked_at is not None and float(r.get(locks.SYNC_STARTED) or 0) >= asked_at:
        return {"skipped": "a sync begun since it was asked for has answered it"}
    r.set(locks.SYNC_DIRTY, 1)
    out: dict = {"skipped": "another worker is syncing; it will go round again"}
    try:
        with locks.held(locks.SYNC_LOCK, ttl=settings.RACKWISE_STALL_S, wait=None):
            while r.getdel(locks.SYNC_DIRTY):
                r.set(locks.SYNC_STARTED, time.time())
                out = cluster_sync.sync()
    except locks.Busy:
        pass
    return out


@shared_task(name="fleet.tasks.detect_failures", **TASK_OPTIONS)
def detect_failures() -> str:
    return str(health.detect_failures())


@shared_task(name="fleet.tasks.reconcile", **TASK_OPTIONS)
def reconcile() -> dict:
    """Re-enqueue what the rows say should be happening but no worker holds, and
    repair drift. Safe to run any time, any number of times."""
    return reconcile_once()


def reconcile_once(now=None) -> dict:
    now = now or timezone.now()
    stall = timedelta(seconds=settings.RACKWISE_STALL_S)
    done: dict[str, list] = {"executing": [], "recovering": [], "released": [], "requeued": []}

    # 1. Approved actions, and executing ones with no progress for a while whose
    #    worker is gone (its lock lapsed), go back to the workers.
    quiet = Q(state=ActionState.APPROVED, updated_at__lte=now - timedelta(seconds=5)) | Q(
        state=ActionState.EXECUTING, updated_at__lte=now - stall
    )
    for action_id in Action.objects.filter(quiet).values_list("pk", flat=True):
        if not locks.is_held(f"rackwise:lock:action:{action_id}") and dispatch.send_once(
            "fleet.tasks.execute_action", action_id
        ):
            done["executing"].append(action_id)

    busy = action_services.open_action_job_ids()
    # 2. Allocations left behind by jobs that no longer hold GPUs.
    done["released"] = job_allocations.release_leaked_allocations()

    # 3. Jobs stuck between steps with no action to carry them on.
    for job in Job.objects.filter(state=JobState.PLACED, placed_at__lte=now - stall).exclude(pk__in=busy):
        try:
            job_allocations.requeue_job(
                None, job.pk, reason="placed but never started; requeued by reconcile"
            )
            done["requeued"].append(job.pk)
        except Conflict:
            pass
    for job_id in (
        Job.objects.filter(state=JobState.RECOVERING).exclude(pk__in=busy).values_list("pk", flat=True)
    ):
        if dispatch.send_once("fleet.tasks.recover_job", job_id):
            done["recovering"].append(job_id)

    # 4. Draining nodes left empty by a release whose settling could not take their lock,
    #    and holds left by an action that ended outside the lifecycle (drift).
    done["drained"] = node_lifecycle.settle_drained_nodes()
    done["holds_released"] = action_lifecycle.release_stale_holds()

    # 5. And a scheduling pass if anything waits. (Jobs that ended in the
    #    cluster are the periodic sync's: fleet.tasks.sync_cluster.)
    if Job.objects.filter(state=JobState.PENDING).exclude(pk__in=busy).exists():
        schedule_pending.delay()
    return done


@shared_task(name="fleet.tasks.deliver_webhooks", **TASK_OPTIONS)
def deliver_webhooks(delivery_ids: list[int]) -> str:
    """Fan one event batch out to one task per delivery (on the webhooks queue),
    so the service that emitted it sends a single message."""
    for delivery_id in delivery_ids:
        deliver_webhook.delay(delivery_id)
    return f"{len(delivery_ids)} queued"


@shared_task(name="fleet.tasks.deliver_webhook", **TASK_OPTIONS)
def deliver_webhook(delivery_id: int) -> str:
    """One attempt at one webhook delivery; a failure schedules the next."""
    outcome = attempt_delivery(delivery_id)
    if outcome.retry_in is not None:
        deliver_webhook.apply_async((delivery_id,), countdown=outcome.retry_in)
    return outcome.message


@shared_task(name="fleet.tasks.sweep_webhooks", **TASK_OPTIONS)
def sweep_webhooks() -> str:
    """Re-enqueue webhook deliveries whose attempt is overdue (a lost message,
    a killed worker); the claim makes a duplicate harmless."""
    r = locks.client()
    due = due_deliveries()
    nudged = 0
    for delivery_id in due:
        # A backlog behind a slow endpoint stays overdue until the worker gets to
        # it: queue each delivery once per SWEEP_NUDGE_S, not once per sweep.
        if r.set(f"rackwise:webhook:nudged:{delivery_id}", 1, nx=True, ex=SWEEP_NUDGE_S):
            deliver_webhook.delay(delivery_id)
            nudged += 1
    return f"{len(due)} overdue, {nudged} queued"


@shared_task(name="fleet.tasks.demo_tick", **TASK_OPTIONS)
def demo_tick() -> str:
    if not settings.RACKWISE_DEMO:
        return "demo mode is off"
    return tick()


@shared_task(name="fleet.tasks.refresh_read_models", **TASK_OPTIONS)
def refresh_read_models() -> str:
    """Recompute the shared read models after a change (fleet.read_cache asks)."""
    return f"read models at generation {read_models.refresh()}"


@shared_task(name="fleet.tasks.sample_fleet", **TASK_OPTIONS)
def sample_fleet() -> str:
    """One point of the console's utilization and fragmentation chart."""
    sample = record_sample()
    return f"sampled: {sample}"


__all__ = [
    "defrag_watch",
    "deliver_webhook",
    "deliver_webhooks",
    "demo_tick",
    "detect_failures",
    "execute_action",
    "plan_defrag",
    "plan_evacuations",
    "recheck_proposals",
    "reconcile",
    "recover_job",
    "refresh_read_models",
    "sample_fleet",
    "schedule_pending",
    "sweep_webhooks",
    "sync_cluster",
]
