"""Re-checking decisions that wait for an operator.

A proposal (a preemption, a migration, a defrag plan...) is planned on the
fleet as it was. While it waits, a failed node may come back or a spare free
up, and the plan becomes the wrong one: a job then waits behind an approval it
no longer needs. This module re-decides such proposals; the caller (a task)
holds the decision lock, as for any decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet import engine
from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Node
from fleet.services.actions import propose as action_services
from fleet.services.actions.lifecycle import HOLD_KINDS, RECOVERY_KINDS
from fleet.services.decisions import recovery as recovery_services

log = logging.getLogger(__name__)

# The engine's order of preference for a recovery (recover.py): a later kind is
# only chosen when the earlier ones are impossible.
RECOVERY_RANK: dict[str, int] = {
    ActionKind.RECOVERY: 0,
    ActionKind.PREEMPTION: 1,
    ActionKind.MIGRATION: 2,
    ActionKind.REQUEUE: 3,
}


@dataclass
class RecheckResult:
    checked: list[int] = field(default_factory=list)
    expired: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)


def _due(rack_ids: Iterable[int] | None, now: datetime) -> tuple[list[int], bool]:
    """Proposals to check: those touching ``rack_ids`` (a rack changed: one of
    their jobs runs there, or they move jobs there), and those not checked for
    RACKWISE_PROPOSAL_RECHECK_S (the periodic bound); and whether any is due by
    the periodic bound."""
    stale = now - timedelta(seconds=settings.RACKWISE_PROPOSAL_RECHECK_S)
    proposed = Action.objects.filter(state=ActionState.PROPOSED)
    by_age = set(
        proposed.filter(
            Q(checked_at__lte=stale) | Q(checked_at__isnull=True, created_at__lte=stale)
        ).values_list("pk", flat=True)
    )
    by_rack: set[int] = set()
    if rack_ids:
        by_rack = set(
            proposed.filter(
                jobs__allocations__released_at__isnull=True,
                jobs__allocations__gpu__node__rack_id__in=list(rack_ids),
            ).values_list("pk", flat=True)
        )
        by_rack |= set(filling(rack_ids))
    return sorted(by_age | by_rack), bool(by_age)


def filling(rack_ids: Iterable[int]) -> list[int]:
    """Waiting plans that move jobs into these racks (their allocate steps'
    nodes are there). A change there (the scheduler placing new work on a
    plan's destination) may have made the plan stale, though none of its jobs
    runs there: such plans are re-checked too. Few plans wait at a time, so
    their steps are read here rather than indexed."""
    racks = set(rack_ids)
    waiting = Action.objects.filter(state=ActionState.PROPOSED, kind__in=HOLD_KINDS).values_list("pk", "plan")
    nodes_of: dict[int, set[int]] = {}
    for pk, plan in waiting:
        nodes_of[pk] = {
            int(n)
            for step in (plan or {}).get("steps", [])
            if step.get("op") == "allocate"
            for n in step.get("nodes", {})
        }
    every = set().union(*nodes_of.values()) if nodes_of else set()
    if not every or not racks:
        return []
    there = set(Node.objects.filter(pk__in=every, rack_id__in=racks).values_list("pk", flat=True))
    return sorted(pk for pk, nodes in nodes_of.items() if nodes & there)


def _better(fresh: action_services.Proposal, current: Action) -> bool:
    """Does the fresh recovery plan beat the waiting one? Earlier in the engine's
    order (a swap beats a preemption beats a move), or the same kind for fewer
    GPU-hours. An equal plan never replaces the one the operator is looking at."""
    new, old = RECOVERY_RANK.get(fresh.kind, 9), RECOVERY_RANK.get(current.kind, 9)
    if new != old:
        return new < old
    return fresh.cost_gpu_hours < current.cost_gpu_hours - 1e-9


def _no_checkpoint() -> None:
    """Without a lease there is nothing to check."""


def recheck_proposals(
    *,
    rack_ids: Iterable[int] | None = None,
    now: datetime | None = None,
    checkpoint: Callable[[], None] = _no_checkpoint,
) -> RecheckResult:
    """Re-decide waiting proposals the fleet may have made obsolete.

    1. Take the proposals that are due (see :func:`_due`). The checks plan on the
       in-memory fleet, rebuilt from the rows first when any is due by age.
    2. A plan that no longer holds on the fleet as it is now expires.
    3. A waiting recovery whose job would now get a better plan (its failed node
       came back, a spare freed up in its rack) expires too: superseded.
    4. Either way the decision is made again at once: a recovering job gets its
       new plan proposed (it runs if the policy says auto: a swap or a restart in
       place); a defrag plan is made again with its own request, in its place
       (``actions.redecide``); other kinds go back to their planner through the
       lifecycle (the scheduler).
    5. A proposal that still stands is stamped ``checked_at``.
    Each transaction calls ``checkpoint()`` (the decision lease) before it commits.
    """
    now = now or timezone.now()
    result = RecheckResult()
    due, periodic = _due(rack_ids, now)
    if periodic:
        # The periodic bound is the safety net for changes that announced nothing
        # (a write outside the services, such as raw SQL, moves no rack version): the in-memory fleet the
        # checks read is rebuilt from the rows first.
        engine.forget_live_fleet()
    for action_id in due:
        result.checked.append(action_id)
        with transaction.atomic():
            action = (
                Action.objects.select_for_update().filter(pk=action_id, state=ActionState.PROPOSED).first()
            )
            if action is None:
                continue  # decided meanwhile
            problems = action_services.check_plan(action)
            recovering = list(action.jobs.filter(state=JobState.RECOVERING).select_related("tenant"))
            fresh: dict[int, action_services.Proposal] = {}
            if action.kind in RECOVERY_KINDS:
                for job in recovering:
                    try:
                        proposal = recovery_services.recovery_proposal(job)
                    except recovery_services.InvalidPlan:
                        proposal = None
                    if proposal is not None:
                        fresh[job.pk] = proposal
                if not problems:
                    better = [p for p in fresh.values() if _better(p, action)]
                    if better:
                        problems = [f"superseded by a better plan: {better[0].title}"]
            if not problems:
                Action.objects.filter(pk=action.pk).update(checked_at=now)
                checkpoint()
                continue
            if action.kind in action_services.REPLANNERS:
                # A plan with a re-planner (a defrag plan) is made again in its
                # place with its own request; the card shows the new one.
                successor = action_services.redecide(None, action, problems)
                if Action.objects.filter(pk=action.pk, state=ActionState.EXPIRED).exists():
                    result.expired.append(action.pk)
                if successor is not None:
                    result.proposed.append(successor.pk)
                log.info(
                    "proposal #%s stale (%s): re-planned as %s", action.pk, "; ".join(problems), successor
                )
                checkpoint()
                continue
            # A recovery with a fresh plan is re-decided right here; anything
            # else by its planner, asked by the lifecycle.
            expired = action_services.expire(
                None, action.pk, problems, expect=(ActionState.PROPOSED,), replan=not fresh, now=now
            )
            if expired is None:
                continue
            result.expired.append(action.pk)
            log.info("proposal #%s expired: %s", action.pk, "; ".join(problems))
            if fresh:
                for action_new in action_services.propose_many(list(fresh.values())):
                    result.proposed.append(action_new.pk)
            checkpoint()
    return result
