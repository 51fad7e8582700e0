"""The Job aggregate's lifecycle: the one writer of ``Job.state``.

Other services ask :func:`transition` (or :func:`apply_many` for a batch they
locked), naming a move; they never write ``Job.state`` themselves, so every
move gets the same check, audit record, live event, rack versions and what
follows.

======== =================================== ====================== ========= =====================
move     from                                to                     audit     then
======== =================================== ====================== ========= =====================
place    pending                             placed                 job.place webhook job.placed
start    placed, recovering                  running                job.start --
swap     placed, running, recovering         recovering             job.swap  --
interrupt placed, running, recovering        recovering             job.interrupt  a recovery decision
requeue  placed, running, recovering         pending                job.requeue    a scheduling pass
cancel   pending, placed, running, recovering cancelled             job.cancel     a pass if GPUs freed
finish   placed, running, recovering,        completed, failed      job.finish     a scheduling pass
         pending with a job in the cluster
======== =================================== ====================== ========= =====================

A move that ends the job's hold on GPUs (requeue, cancel, finish) releases them
in the same transaction (``allocations.release``, its effect); a draining node
it leaves empty becomes drained in a transaction of its own once this one
commits, node row first (the node lifecycle's ``settle``), so a job's
transaction never locks a node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet import dispatch, events
from fleet.choices import ACTIVE_JOB_STATES, FINISHED_JOB_STATES, HOLDING_JOB_STATES, JobState
from fleet.cluster.registry import get_adapter
from fleet.models import Job
from fleet.services import audit
from fleet.services.errors import Conflict
from fleet.services.racks import bump_versions, racks_held_by
from fleet.text import clip

S = JobState
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Move:
    """A move of the job lifecycle: where it may start, where it may end, and
    what the refusal says (``{id}`` and ``{state}`` filled in)."""

    name: str
    allowed_from: tuple[str, ...]
    to: tuple[str, ...]
    refusal: str

    @property
    def audit_action(self) -> str:
        return f"job.{self.name}"


MOVES: dict[str, Move] = {
    m.name: m
    for m in (
        Move("place", (S.PENDING,), (S.PLACED,), "job #{id} is {state}, not pending; it cannot be placed"),
        Move(
            "start",
            (S.PLACED, S.RECOVERING),
            (S.RUNNING,),
            "job #{id} is {state}; only a placed or recovering job can start",
        ),
        Move("swap", HOLDING_JOB_STATES, (S.RECOVERING,), "job #{id} is {state}; it holds no nodes to swap"),
        Move(
            "interrupt",
            HOLDING_JOB_STATES,
            (S.RECOVERING,),
            "job #{id} is {state}; it holds no GPUs to interrupt",
        ),
        Move(
            "requeue",
            HOLDING_JOB_STATES,
            (S.PENDING,),
            "job #{id} is {state}; only a job holding GPUs can be requeued",
        ),
        Move(
            "cancel",
            ACTIVE_JOB_STATES,
            (S.CANCELLED,),
            "job #{id} is already {state}; only pending, placed, running or recovering jobs can be cancelled",
        ),
        Move(
            "finish",
            (*HOLDING_JOB_STATES, S.PENDING),
            (S.COMPLETED, S.FAILED),
            "job #{id} is {state}; it holds no GPUs to finish with",
        ),
    )
}

# The jobs whose end the cluster may report: those that hold GPUs (placed,
# running, recovering), and pending jobs that have a job in the cluster (held
# there while Rackwise places them: adopted, or stopped for a move).
CLUSTER_MAY_END = Q(state__in=HOLDING_JOB_STATES) | Q(state=S.PENDING, external_id__isnull=False)


def cluster_may_end(job: Job) -> bool:
    """``job`` is one of :data:`CLUSTER_MAY_END` (the same rule, on a row)."""
    return job.state in HOLDING_JOB_STATES or (job.state == S.PENDING and bool(job.external_id))


def snapshot(job: Job) -> dict[str, object]:
    return {"state": job.state, "state_reason": job.state_reason}


def refusal(job: Job, move: str) -> str | None:
    """Why ``job`` cannot make ``move`` now, or None if it can."""
    spec = MOVES[move]
    # A pending job finishes only when it has a job in the cluster that ended.
    allowed = cluster_may_end(job) if move == "finish" else job.state in spec.allowed_from
    return None if allowed else spec.refusal.format(id=job.pk, state=job.state)


def transition(
    actor,
    job_id: int,
    move: str,
    *,
    to: str | None = None,
    reason: str = "",
    expect: str | None = None,
    expect_attempt: int | None = None,
    effect: Callable[[Job], set[int] | None] | None = None,
    audit_action: str | None = None,
    before_extra: dict[str, Any] | None = None,
    after_extra: Callable[[Job], dict[str, Any]] | None = None,
    tell_cluster: bool = True,
) -> Job:
    """Move job ``job_id`` by ``move`` (a key of :data:`MOVES`), in one transaction:

    1. lock the row; check the move (Conflict if its state does not allow it, or
       it is not in ``expect``, or it is not at attempt ``expect_attempt``);
    2. run ``effect`` (the move's own writes, such as releasing the job's GPUs
       for a requeue, cancel or finish; it returns the racks it touched);
    3. save the new state (``to``, needed when the move has several ends) and
       reason; audit (``audit_action`` in place of the move's own);
    4. send the live event, move the versions of the racks touched and held,
       and do what follows the move (the module table)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        why = refusal(job, move)
        if why is None and expect is not None and job.state != expect:
            why = f"job #{job.pk} is {job.state}, not {expect}: {job.state_reason or 'its state changed'}"
        if why is None and expect_attempt is not None and job.attempt != expect_attempt:
            why = f"job #{job.pk} is at attempt {job.attempt}, not {expect_attempt}; the report is stale"
        if why is not None:
            raise Conflict(why)
        spec = MOVES[move]
        before = snapshot(job) | (before_extra or {})
        touched = set(effect(job) or ()) if effect else set()
        _set(job, spec, to, reason)
        update = ["state", "state_reason"]
        if move == "start":
            job.started_at = job.started_at or timezone.now()
            job.attempt += 1
            update += ["started_at", "attempt"]
        elif job.state in FINISHED_JOB_STATES:
            job.finished_at = job.finished_at or timezone.now()
            update.append("finished_at")
        job.save(update_fields=update)
        after = snapshot(job) | (after_extra(job) if after_extra else {})
        audit.record(
            actor,
            audit_action or spec.audit_action,
            job,
            before=before,
            after=after,
            message=reason if spec.name not in ("cancel", "start") else "",
        )
        events.jobs_changed([job.pk])
        bump_versions(touched | racks_held_by([job.pk]))
        _then(job, spec, freed=bool(touched), tell_cluster=tell_cluster)
    return job


def note_waiting(job_id: int, reason: str) -> None:
    """Say why a pending job still waits (the scheduler's words, a rollback's).
    Not a move: no audit, no event (a pass rewrites it for every waiting job);
    a job no longer pending is left as it is."""
    Job.objects.filter(pk=job_id, state=S.PENDING).exclude(state_reason=clip(reason)).update(
        state_reason=clip(reason)
    )


def apply_many(
    actor,
    jobs: list[Job],
    move: str,
    *,
    reason_of: Callable[[Job], str],
    message_of: Callable[[Job], str] | None = None,
    fields: dict[str, Any] | None = None,
) -> None:
    """Make ``move`` for jobs the caller locked (and left out those
    :func:`refusal` refuses: Conflict, nothing written, if one is left) in its
    transaction: one UPDATE per distinct reason for the state, reason and
    ``fields``, one audit insert (``message_of`` each, default the reason), one
    live event. The caller moves the racks' versions (it knows them without a
    query). For batches: the scheduler's placements, the jobs a failed node
    interrupts."""
    spec = MOVES[move]
    refused = [why for job in jobs if (why := refusal(job, move)) is not None]
    if refused:
        raise Conflict("; ".join(refused))
    fields = fields or {}
    befores = {job.pk: snapshot(job) for job in jobs}
    by_reason: dict[str, list[int]] = {}
    for job in jobs:
        _set(job, spec, None, reason_of(job))
        for name, value in fields.items():
            setattr(job, name, value)
        by_reason.setdefault(job.state_reason, []).append(job.pk)
    for reason, ids in by_reason.items():
        Job.objects.filter(pk__in=ids).update(state=spec.to[0], state_reason=reason, **fields)
    message_of = message_of or (lambda job: job.state_reason)
    audit.record_many(
        actor, spec.audit_action, [(job, befores[job.pk], snapshot(job), message_of(job)) for job in jobs]
    )
    events.jobs_changed(job.pk for job in jobs)
    for job in jobs:
        _then(job, spec, freed=False, tell_cluster=False)


def _set(job: Job, spec: Move, to: str | None, reason: str) -> None:
    to = to or spec.to[0]
    if to not in spec.to:
        raise ValueError(f"a {spec.name} ends {' or '.join(spec.to)}, not {to}")
    job.state = to
    job.state_reason = clip(reason)


def _then(job: Job, spec: Move, *, freed: bool, tell_cluster: bool) -> None:
    if spec.name == "interrupt":
        dispatch.recover_soon(job.pk)
    elif spec.name in ("requeue", "finish") or (spec.name == "cancel" and freed):
        dispatch.schedule_soon()
    if spec.name == "cancel" and tell_cluster:
        transaction.on_commit(lambda: _cancel_in_cluster(job))


def _cancel_in_cluster(job: Job) -> None:
    try:
        get_adapter().cancel(job)
    except Exception:  # best effort: the job is cancelled in Rackwise whatever the cluster says
        log.warning("job #%s: the cluster could not be told of the cancel", job.pk, exc_info=True)
