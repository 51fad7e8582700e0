"""Actions: decisions as ordered steps, approved by policy or by an operator, and
carried out one step at a time.

Every state change goes through :mod:`fleet.services.action_lifecycle` (a row
lock and a check against its table of transitions), so a task delivered twice
does the work once and every end is audited, announced and settled alike.

Each step is a typed step (:mod:`fleet.cluster.steps`); the cluster adapter
(:mod:`fleet.cluster`, chosen by ``RACKWISE_CLUSTER``) does its cluster side,
and the rules of :mod:`fleet.services.steps` check it against the fleet and
apply its database side. A cluster that cannot be reached leaves the action
where it was: the step is retried with backoff (:data:`RETRY_BASE_S`, doubling,
at most :data:`RETRY_MAX_S`) and nothing is applied for it meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from fleet import engine, events
from fleet.choices import FINISHED_JOB_STATES, OPEN_ACTION_STATES, ActionKind, ActionState, ApprovalMode, Role
from fleet.cluster.base import WAITING, ClusterAdapter, ClusterUnavailable, StepFailed
from fleet.cluster.registry import get_adapter
from fleet.cluster.steps import Step, StepError
from fleet.models import Action, ApprovalPolicy, Job, Rack
from fleet.permissions import has_role
from fleet.services import action_lifecycle as lifecycle
from fleet.services import audit, cluster_sync, rollback
from fleet.services import jobs as job_services
from fleet.services import steps as step_rules
from fleet.services.errors import Conflict, InvalidInput, NotAllowed, ServiceError
from placement.validate import validate

log = logging.getLogger(__name__)

__all__ = ["StepFailed"]  # raised by adapters; importable from here as before

# Backoff of a step the cluster could not be reached for: 2, 4, 8 ... 60 s.
RETRY_BASE_S = 2
RETRY_MAX_S = 60
RETRYING = "retrying"


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
    steps: list[Step | dict]  # typed steps; stored dicts (tests, old callers) pass as they are
    jobs: list[int]
    engine_plan: dict | None = None
    cost_gpu_hours: float = 0.0
    benefit: dict | None = None
    done_steps: int = 0
    # What was asked for (a defrag's target, budget, move limit): a re-plan asks again.
    request: dict | None = None
    # The plan this one replaces (see fleet.services.defrag.replan).
    replaces: int | None = None


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
        auto = modes[p.kind] == ApprovalMode.AUTO
        rows.append(
            Action(
                kind=p.kind,
                title=p.title[:300],
                plan={"steps": steps, "engine": p.engine_plan or {}, **({"request": p.request} if p.request else {})},
                replaces_id=p.replaces,
                cost_gpu_hours=round(p.cost_gpu_hours, 4),
                benefit=p.benefit or {},
                fleet_version=version,
                proposed_by=actor if actor is not None and actor.pk else None,
                proposed_by_name=audit.actor_name(actor),
                state=ActionState.EXECUTING if p.done_steps else (ActionState.APPROVED if auto else ActionState.PROPOSED),
                decided_by_name="policy (auto)" if auto else "",
                decided_at=now if auto else None,
                step_index=p.done_steps,
                progress=p.done_steps / len(steps) if steps else 1.0,
                started_at=now if p.done_steps else None,
                log=[_log_entry(i, Step.from_dict(s), "done") for i, s in enumerate(steps[: p.done_steps])],
            )
        )
    return lifecycle.create(rows, [p.jobs for p in proposals], actor)


def open_action_job_ids() -> set[int]:
    """Jobs held by an open action: the scheduler and recovery leave them alone."""
    return set(
        Action.jobs.through.objects.filter(action__state__in=OPEN_ACTION_STATES).values_list("job_id", flat=True)
    )


# --- operator decisions ------------------------------------------------------------


def _decide(actor, action_id: int, to_state: str, note: str) -> Action:
    """An operator's decision (approve or reject) on a proposed action, through
    the lifecycle, recording who decided and when."""
    _require_operator(actor)
    return lifecycle.transition(
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
# fleet.services.defrag): make a new plan in place of ``action`` that the fleet
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
    return lifecycle.transition(
        actor,
        action_id,
        ActionState.CANCELLED,
        message=note,
        fields={"decision_note": note[:500]} if note else None,
        log=f"cancelled by {audit.actor_name(actor)}",
    )


def set_policy(actor, kind: str, mode: str) -> ApprovalPolicy:
    _require_operator(actor)
    if kind not in ActionKind.values:
        raise InvalidInput({"kind": [f"unknown action kind {kind!r}; use one of: {', '.join(ActionKind.values)}"]})
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
    rule in :mod:`fleet.services.steps`) and run the engine's invariant checker
    on the jobs they touch. The nodes held for the action are its own; nodes
    held for another plan are not free. Returns the problems (empty: the plan
    still holds)."""
    steps = action.steps[action.step_index:] if steps is None else steps
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


# --- executing ------------------------------------------------------------------


@dataclass
class StepResult:
    more: bool
    message: str = ""
    # Seconds after which the caller should run the action again (the cluster
    # was unreachable); None: nothing to schedule.
    retry_in: float | None = None


DONE_ELSEWHERE = "step done elsewhere"


def _log_entry(index: int, step: Step, status: str, message: str = "") -> dict:
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


def retry_delay(retries: int) -> int:
    """The wait before retry number ``retries`` (1, 2, ...): 2, 4, 8 ... capped."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2 ** max(0, retries - 1))


def retries_so_far(action: Action, index: int) -> int:
    """How many times step ``index`` was put off because the cluster was
    unavailable, from the action's log (its last entry, if it is such a retry)."""
    last = action.log[-1] if action.log else None
    if last and last.get("status") == RETRYING and last.get("step") == index:
        return int(last.get("retries", 1))
    return 0


def _starting_plan(action: Action) -> bool:
    """A plan that holds nodes and has done no step yet: checked before it starts."""
    return action.kind in lifecycle.HOLD_KINDS and (
        action.state == ActionState.APPROVED or (action.state == ActionState.EXECUTING and action.step_index == 0)
    )


def needs_decision_to_begin(action_id: int) -> bool:
    """Whether :func:`begin` may decide (re-plan, take holds) for this action:
    the caller then takes the decision lock first."""
    action = Action.objects.filter(pk=action_id).only("kind", "state", "step_index").first()
    return action is not None and _starting_plan(action)


def begin(action_id: int) -> StepResult | None:
    """Start an approved action: the re-check before its first step
    (:func:`recheck_before_start`), then approved -> executing. Also re-checks a
    plan that holds nodes and was claimed but has done no step yet (its worker
    died). Returns None when it is executing and may go on, else why not. The
    caller holds the decision lock when it can (``fleet.tasks.execute_action``):
    a stale plan is made again here."""
    action = Action.objects.filter(pk=action_id).first()
    if action is None:
        return StepResult(False, "gone")
    if action.state != ActionState.APPROVED and not _starting_plan(action):
        return None if action.state == ActionState.EXECUTING else StepResult(False, action.state)
    stale = recheck_before_start(action)
    if stale is not None:
        return stale
    if action.state == ActionState.APPROVED and lifecycle.transition(
        None, action.pk, ActionState.EXECUTING, quiet=True
    ) is None:
        return StepResult(False, "claimed elsewhere")
    return None


def execute_next_step(action_id: int, adapter: ClusterAdapter | None = None, *, begun: bool = False) -> StepResult:
    """Carry out the next step of an approved or executing action.

    1. An approved action is checked against the current fleet; a plan that no
       longer holds is marked expired (and a new decision is requested).
    2. The adapter does the step in the cluster (it may say: wait, for a
       callback). A cluster that cannot be reached leaves the action executing
       at this step, with a log entry, and the caller is told when to try again
       (``retry_in``); a step the cluster refuses fails the action, and the
       jobs it stopped run again (:func:`fleet.services.rollback.roll_back`).
    3. Under the action's row lock, the step's database change is applied (its
       rule in :mod:`fleet.services.steps`), the job's id in the cluster stored
       if the step gave it one, and the step counted, in one transaction; a
       second worker finds the step done.
    Returns whether more steps remain for this call to make.
    """
    adapter = adapter or get_adapter()
    if not begun:
        not_started = begin(action_id)
        if not_started is not None:
            return not_started
    action = Action.objects.filter(pk=action_id).first()
    if action is None:
        return StepResult(False, "gone")
    if action.state != ActionState.EXECUTING:
        return StepResult(False, action.state)
    steps = action.steps
    index = action.step_index
    if index >= len(steps):
        _finish(action.pk)
        return StepResult(False, "succeeded")
    try:
        step = Step.from_dict(steps[index])
    except StepError as exc:
        op = steps[index].get("op", "?") if isinstance(steps[index], dict) else "?"
        _fail(action.pk, index, op, str(exc), adapter)
        return StepResult(False, "failed")
    ended = _ended_meanwhile(action, step)
    if ended is not None:
        return _commit_step(action.pk, index, steps, step, skipped=ended)
    try:
        outcome = adapter.perform(action, index, step, lambda done: lifecycle.step_progress(action, index, done))
    except StepFailed as exc:
        _fail(action.pk, index, step.op, str(exc), adapter)
        if step.job is not None:
            # The cluster may say why (the job ended there): apply it now, so
            # the scheduler does not place an ended job again before the next sync.
            cluster_sync.sync_jobs(adapter, job_ids=[step.job])
        return StepResult(False, "failed")
    except ClusterUnavailable as exc:
        return _put_off(action.pk, index, step, str(exc))
    if outcome.status == WAITING:
        return StepResult(False, outcome.message or "waiting for the cluster")
    try:
        result = _commit_step(action.pk, index, steps, step, external_id=outcome.external_id)
    except ServiceError as exc:
        ended = _ended_meanwhile(action, step)  # it ended while the cluster did its part
        if ended is not None:
            return _commit_step(action.pk, index, steps, step, skipped=ended)
        _fail(action.pk, index, step.op, str(exc), adapter)
        return StepResult(False, "failed")
    if result.message != DONE_ELSEWHERE:
        adapter.after_step(action, index, step)
    return result


# Plans that stop or move jobs to make room: a job that ends by itself while
# the plan runs has made its room, and its remaining steps are skipped (the
# soak saw a defrag plan fail, after moving one job, on the stop of a job that
# had just completed).
MOOT_WHEN_ENDED = (ActionKind.DEFRAG, ActionKind.MIGRATION, ActionKind.PREEMPTION)


def _ended_meanwhile(action: Action, step: Step) -> str | None:
    """Why ``step`` of ``action`` has nothing left to do (its job ended), or None."""
    if action.kind not in MOOT_WHEN_ENDED or step.job is None:
        return None
    state = Job.objects.filter(pk=step.job).values_list("state", flat=True).first()
    if state not in FINISHED_JOB_STATES:
        return None
    return f"skipped: job #{step.job} ended ({state}) before this step; the room it held is free"


def _commit_step(
    action_id: int, index: int, steps: list, step: Step, *, external_id: str | None = None, skipped: str | None = None
) -> StepResult:
    """Under the action's row lock: apply the step's database change (not for a
    ``skipped`` one, whose log entry says why), store the job's id in the
    cluster if the step gave one, count the step, and finish the action after
    its last, in one transaction. ServiceError if the change is refused."""
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=action_id)
        if locked.state != ActionState.EXECUTING or locked.step_index != index:
            return StepResult(False, DONE_ELSEWHERE)
        if skipped is None:
            step_rules.apply(None, locked, step)
            if external_id and step.job is not None:
                job_services.set_external_id(step.job, external_id)
        locked.step_index = index + 1
        locked.progress = (index + 1) / len(steps)
        locked.step_started_at = None
        entry = _log_entry(index, step, "skipped" if skipped else "done", skipped or "")
        locked.log = [*locked.log, entry]
        locked.save(update_fields=["step_index", "progress", "step_started_at", "log", "updated_at"])
        audit.record(None, "action.step", locked, after={"step": index, "op": step.op, "status": entry["status"]},
                     message=entry["message"])
        events.actions_changed([locked.pk])
        last = index + 1 >= len(steps)
        if last:
            # In the same transaction: nobody sees the job started by an
            # action still executing.
            _finish(action_id)
    return StepResult(False, "succeeded") if last else StepResult(True)


def _put_off(action_id: int, index: int, step: Step, error: str) -> StepResult:
    """The cluster could not be reached for step ``index``: the action stays
    executing at that step, and its log says when it is tried again. Repeated
    retries of one step update one log entry (a long outage does not grow the
    log by an entry a minute), counting them for the backoff."""
    with transaction.atomic():
        action = Action.objects.select_for_update().filter(pk=action_id).first()
        if action is None or action.state != ActionState.EXECUTING or action.step_index != index:
            return StepResult(False, DONE_ELSEWHERE)
        retries = retries_so_far(action, index) + 1
        delay = retry_delay(retries)
        entry = _log_entry(index, step, RETRYING, f"cluster unavailable, retrying in {delay} s: {error}"[:1000])
        entry["retries"] = retries
        kept = action.log[:-1] if retries > 1 else action.log
        action.log = [*kept, entry]
        action.save(update_fields=["log", "updated_at"])
        events.actions_changed([action.pk])
    log.warning("action #%s step %s: cluster unavailable, retrying in %s s: %s", action_id, index, delay, error)
    return StepResult(False, f"cluster unavailable, retrying in {delay} s", retry_in=delay)


def _finish(action_id: int) -> None:
    lifecycle.transition(None, action_id, ActionState.SUCCEEDED, fields={"progress": 1.0}, quiet=True)


def _fail(action_id: int, index: int, op: str, error: str, adapter: ClusterAdapter | None = None) -> None:
    """Step ``index`` failed: the jobs the plan stopped run again (a plan that
    holds nodes, while it still holds them), then the action fails, with what
    the failure cost in GPU-hours."""
    message = f"step {index + 1} ({op}) failed: {error}"
    action = Action.objects.filter(pk=action_id).first()
    if action is None or action.state != ActionState.EXECUTING or action.step_index != index:
        return
    entries: list[dict] = [_failed_entry(index, op, error)]
    fields: dict = {}
    if action.kind in lifecycle.HOLD_KINDS:
        outcome = rollback.roll_back(action, adapter or get_adapter())
        entries += outcome.entries
        lost = lifecycle.lost_so_far(action)
        fields["lost_gpu_hours"] = round(lost, 4)
        message += f"; {outcome.summary()}; {lost:.1f} GPU-hours lost"
    with transaction.atomic():
        action = Action.objects.select_for_update().get(pk=action_id)
        failed = lifecycle.transition(
            None,
            action_id,
            ActionState.FAILED,
            message=message,
            fields={"error": message, "log": [*action.log, *entries], **fields},
            expect=(ActionState.EXECUTING,),
            quiet=True,
        )
    if failed is not None:
        log.warning("action #%s failed: %s", action_id, message)


# --- before the first step, and after a failure ------------------------------------------


def recheck_before_start(action: Action) -> StepResult | None:
    """Right before a plan's first step (its first checkpoint or stop), check it
    once more on the fleet as it is now, with its holds. None: it still holds.
    Else it is made again (a plan that holds nodes, by its kind's re-planner:
    the new plan runs at once when it costs no more than the approved one, and
    waits for the operator otherwise) or expires saying why, and no job has been
    stopped. Recovery and other kinds keep their old rule: they expire and the
    decision is made again."""
    problems = check_plan(action)
    if not problems:
        return None
    if action.kind not in lifecycle.HOLD_KINDS:
        expire(None, action.pk, problems)
        return StepResult(False, "expired")
    successor = redecide(None, action, [f"stale before its first step: {'; '.join(problems)}"], keep_approval=True)
    if successor is None:
        return StepResult(False, "expired")
    return StepResult(False, f"re-planned as #{successor.pk} ({successor.state})")



def _failed_entry(index: int, op: str, error: str) -> dict:
    return {"at": timezone.now().isoformat(), "step": index, "op": op, "status": "failed", "message": error}


def expire(
    actor, action_id: int, problems: list[str], *, expect: tuple[str, ...] | None = None, replan: bool = True, now=None
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
