"""Actions proposed and decided: decisions as ordered steps (typed steps,
:mod:`fleet.steps`), recorded as proposals, approved by policy or by an
operator, rejected, cancelled or expired; a plan checked against the fleet as
it is now (each step by its rule, :mod:`fleet.services.actions.rules`) and
re-planned when it went stale. Every state change goes through the action
lifecycle (:mod:`fleet.services.actions.lifecycle`); carrying the steps out is
:mod:`fleet.services.execution.execute`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from fleet import engine
from fleet.choices import OPEN_ACTION_STATES, ActionKind, ActionState, ApprovalMode, Role
from fleet.models import Action, ApprovalPolicy, Job, Rack
from fleet.permissions import has_role
from fleet.services import audit
from fleet.services.actions import lifecycle
from fleet.services.actions import rules as step_rules
from fleet.services.errors import Conflict, InvalidInput, NotAllowed
from fleet.steps import Step, StepError
from placement.validate import validate


def fleet_version() -> int:
    """A fleet-wide version: the sum of rack versions, which only ever grows."""
    return Rack.objects.aggregate(v=Sum("version"))["v"] or 0


def _require_operator(actor) -> None:
    if not has_role(actor, Role.OPERATOR):
        raise NotAllowed("only operators can decide on actions")


# --- proposing ------------------------------------------------------------------------


@dataclass
class Proposal:
    """A decision to record as an Action (see :func:`propose`)."""

    kind: str
    title: str
    steps: Sequence[Step | dict]  # typed steps; stored dicts (tests, old callers) pass as they are
    jobs: list[int]
    # What the steps cannot say (a recovery's or defrag's moves with their costs).
    engine_plan: dict | None = None
    cost_gpu_hours: float = 0.0
    benefit: dict | None = None
    done_steps: int = 0
    # What was asked for (a defrag's target, budget, move limit): a re-plan asks again.
    request: dict | None = None
    # The plan this one replaces (see fleet.services.decisions.defrag.replan).
    replaces: int | None = None
    # Wait for an operator whatever the kind's policy (a reclaim above its cost threshold).
    needs_approval: bool = False


def propose(*, actor=None, version: int | None = None, **fields) -> Action:
    """Record one decision; see :func:`propose_many`."""
    return propose_many([Proposal(**fields)], actor=actor, version=version)[0]


def propose_many(proposals: list[Proposal], *, actor=None, version: int | None = None) -> list[Action]:
    """Record decisions as actions, in one transaction with a handful of queries
    whatever their number. Kinds the approval policy runs automatically start
    executing on commit; the others wait for an operator.

    ``done_steps`` marks leading steps the caller already carried out in the same
    transaction (the scheduler allocates inline, under its lock). ``version`` is
    the fleet version the plans were made on (read now if not given)."""
    if not proposals:
        return []
    version = fleet_version() if version is None else version
    modes = {kind: ApprovalPolicy.mode_for(kind) for kind in {p.kind for p in proposals}}
    now = timezone.now()
    rows = []
    for p in proposals:
        steps = [s.to_dict() if isinstance(s, Step) else s for s in p.steps]
        auto = modes[p.kind] == ApprovalMode.AUTO and not p.needs_approval
        rows.append(
            Action(
                kind=p.kind,
                title=p.title[:300],
                plan={
                    "steps": steps,
                    **({"engine": p.engine_plan} if p.engine_plan else {}),
                    **({"request": p.request} if p.request else {}),
                },
                replaces_id=p.replaces,
                cost_gpu_hours=round(p.cost_gpu_hours, 4),
                benefit=p.benefit or {},
                fleet_version=version,
                proposed_by=actor if actor is not None and actor.pk else None,
                proposed_by_name=audit.actor_name(actor),
                state=ActionState.EXECUTING
                if p.done_steps
                else (ActionState.APPROVED if auto else ActionState.PROPOSED),
                decided_by_name="policy (auto)" if auto else "",
                decided_at=now if auto else None,
                step_index=p.done_steps,
                progress=p.done_steps / len(steps) if steps else 1.0,
                started_at=now if p.done_steps else None,
                log=[log_entry(i, Step.from_dict(s), "done") for i, s in enumerate(steps[: p.done_steps])],
            )
        )
    return lifecycle.create(rows, [p.jobs for p in proposals], actor)


def open_action_job_ids() -> set[int]:
    """Jobs held by an open action: the scheduler and recovery leave them alone."""
    return set(
        Action.jobs.through.objects.filter(action__state__in=OPEN_ACTION_STATES).values_list(
            "job_id", flat=True
        )
    )


# --- operator decisions ------------------------------------------------------------


def _decide(actor, action_id: int, to_state: str, note: str) -> Action:
    """An operator's decision (approve or reject) on a proposed action, through
    the lifecycle, recording who decided and when."""
    _require_operator(actor)
    action = lifecycle.transition(
        actor,
        action_id,
        to_state,
        message=note,
        fields={
            "decision_note": note[:500],
            "decided_by": actor,
            "decided_by_name": audit.actor_name(actor),
            "decided_at": timezone.now(),
        },
        expect=(ActionState.PROPOSED,),
    )
    assert action is not None  # not quiet: a refused move raises
    return action


class Replanned(Conflict):
    """An approval that found its plan stale: the plan was made again
    (``successor``, which replaces it) and waits for the operator to confirm
    the new cost. The API answers 409 with the new plan."""

    def __init__(self, action: Action, successor: Action, why: str) -> None:
        super().__init__(
            f"action #{action.pk} went stale ({why}); re-planned as #{successor.pk} for "
            f"{successor.cost_gpu_hours:.1f} GPU-hours (it was {action.cost_gpu_hours:.1f}): "
            f"approve #{successor.pk} to confirm"
        )
        self.action = action
        self.successor = successor


# A kind's re-planner (registered by its planner: ActionKind.DEFRAG by
# fleet.services.decisions.defrag): make a new plan in place of ``action`` that the fleet
# moved away from (``problems``), expiring it; None when no new plan can be made
# (it expires saying why). ``keep_approval``: an approved plan re-checked before
# its first step, whose approval carries over to a new plan within its cost.
Replanner = Callable[..., Action | None]
REPLANNERS: dict[str, Replanner] = {}


def redecide(actor, action: Action, problems: list[str], *, keep_approval: bool = False) -> Action | None:
    """The plan of ``action`` no longer holds: its kind's re-planner puts a new
    plan in its place (returned), or, for a kind without one, it expires and the
    lifecycle asks for a new decision (None)."""
    replanner = REPLANNERS.get(action.kind)
    if replanner is None:
        expire(actor, action.pk, problems)
        return None
    return replanner(actor, action, problems, keep_approval=keep_approval)


def latest_replacement(action: Action) -> Action | None:
    """The newest plan in the chain of re-plans that replaced ``action``."""
    seen = {action.pk}
    newest = None
    current = action
    while (next_id := current.replaced_by) is not None and next_id not in seen:
        seen.add(next_id)
        current = newest = Action.objects.get(pk=next_id)
    return newest


def approve(actor, action_id: int, note: str = "") -> Action:
    """proposed -> approved; a worker starts executing it on commit.

    A plan that holds nodes (``lifecycle.HOLD_KINDS``) is checked on the fleet as
    it is now first, and holds its nodes from this commit on. One that went stale
    since it was proposed is made again (Replanned, a 409 with the new plan and
    cost, which the operator confirms by approving it) instead of being approved
    and failing; one already replaced answers with its replacement. The caller
    holds the decision lock, as for any decision (the API does)."""
    _require_operator(actor)
    action = Action.objects.filter(pk=action_id).first()
    if action is not None and action.kind in lifecycle.HOLD_KINDS:
        if action.state == ActionState.EXPIRED and (newer := latest_replacement(action)) is not None:
            if newer.state == ActionState.PROPOSED:
                raise Replanned(action, newer, action.error or "superseded")
        elif action.state == ActionState.PROPOSED:
            problems = check_plan(action)
            if problems:
                why = "; ".join(problems)
                successor = redecide(actor, action, [f"stale at approval: {why}"])
                if successor is not None:
                    raise Replanned(action, successor, why)
                action.refresh_from_db()
                raise Conflict(f"action #{action.pk} went stale and expired: {action.error}")
    return _decide(actor, action_id, ActionState.APPROVED, note)


def reject(actor, action_id: int, note: str = "") -> Action:
    """Refuse a proposed action. A refused preemption or migration leaves the job
    with no way to recover in place, so it goes back to the queue."""
    return _decide(actor, action_id, ActionState.REJECTED, note)


def cancel(actor, action_id: int, note: str = "") -> Action:
    """Stop an open action before its next step. Steps already done stay done;
    jobs left between steps are settled by the lifecycle."""
    _require_operator(actor)
    action = lifecycle.transition(
        actor,
        action_id,
        ActionState.CANCELLED,
        message=note,
        fields={"decision_note": note[:500]} if note else None,
        log=f"cancelled by {audit.actor_name(actor)}",
    )
    assert action is not None  # not quiet: a refused move raises
    return action


def set_policy(actor, kind: str, mode: str) -> ApprovalPolicy:
    _require_operator(actor)
    if kind not in ActionKind.values:
        raise InvalidInput(
            {"kind": [f"unknown action kind {kind!r}; use one of: {', '.join(ActionKind.values)}"]}
        )
    if mode not in ApprovalMode.values:
        raise InvalidInput({"mode": [f"unknown mode {mode!r}; use auto or manual"]})
    with transaction.atomic():
        before = ApprovalPolicy.mode_for(kind)
        policy, _ = ApprovalPolicy.objects.update_or_create(kind=kind, defaults={"mode": mode})
        audit.record(actor, "policy.change", policy, before={"mode": before}, after={"mode": mode})
    return policy


def policies() -> dict[str, str]:
    return {kind: ApprovalPolicy.mode_for(kind) for kind in ActionKind.values}


# --- checking a plan against the fleet as it is now ----------------------------


def check_plan(action: Action, steps: list[dict] | None = None) -> list[str]:
    """Replay the remaining steps on the fleet as it is now (each by its
    rule in :mod:`fleet.services.actions.rules`) and run the engine's invariant checker
    on the jobs they touch. The nodes held for the action are its own; nodes
    held for another plan are not free. Returns the problems (empty: the plan
    still holds)."""
    steps = action.steps[action.step_index :] if steps is None else steps
    try:
        typed = [Step.from_dict(s) for s in steps]
    except StepError as exc:
        return [str(exc)]
    ids = [s.job for s in typed if s.job is not None]
    jobs = {str(j.pk): j for j in Job.objects.select_related("tenant").filter(pk__in=ids)}
    # The in-memory fleet brought up to date (a full load is 0.7 s at 1,000 racks,
    # and a rack change rechecks every open proposal); the steps are replayed in a
    # trial, which leaves it as it was.
    with engine.live_snapshot() as snap, snap.fleet.trial():
        # The nodes held for this plan are its own (the trial gives them back).
        snap.unhold(action.pk)
        ctx = step_rules.PlanCheck(snap, jobs, action_id=action.pk)
        for step in typed:
            step_rules.check(ctx, step)
        problems = ctx.problems
        if not problems:
            fleet = ctx.fleet
            scope = {j: fleet.allocations[j] for j in ctx.touched if j in fleet.allocations}
            problems += [str(v) for v in validate(fleet, scope)]
    return problems


def log_entry(index: int, step: Step, status: str, message: str = "") -> dict:
    return {
        "at": timezone.now().isoformat(),
        "step": index,
        "op": step.op,
        "status": status,
        "message": message or step.describe(),
    }


def describe_step(step: dict) -> str:
    """A stored step in words. A step reduced for a reader who may not see it
    (``fleet.redact``) may not parse; it is named by op and job."""
    try:
        return Step.from_dict(step).describe()
    except StepError:
        return f"{step.get('op')} job #{step.get('job')}"


def expire(
    actor,
    action_id: int,
    problems: list[str],
    *,
    expect: tuple[str, ...] | None = None,
    replan: bool = True,
    now=None,
) -> Action | None:
    """The fleet moved on since the plan was made (or a cheaper plan exists):
    expire a proposed or approved action and, unless ``replan`` is False (the
    caller decides again itself), ask for a new decision. Returns None if the
    action had left those states meanwhile."""
    error = "; ".join(problems) or "superseded"
    return lifecycle.transition(
        actor,
        action_id,
        ActionState.EXPIRED,
        message=error,
        fields={"error": error[:2000]},
        expect=expect,
        quiet=True,
        replan=replan,
        now=now,
    )
