"""Actions carried out, one step at a time.

The cluster adapter (:mod:`fleet.cluster`, chosen by ``RACKWISE_CLUSTER``) does
each step's cluster side, and its rule (:mod:`fleet.services.actions.rules`)
applies its database side. A cluster that cannot be reached leaves the action
where it was: the step is retried with backoff (:data:`RETRY_BASE_S`, doubling,
at most :data:`RETRY_MAX_S`) and nothing is applied for it meanwhile. A step
the cluster refuses fails the action, and the jobs it stopped run again
(:mod:`fleet.services.execution.rollback`). Every state change goes through the
action lifecycle, so a task delivered twice does the work once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from django.db import transaction
from django.utils import timezone

from fleet import events
from fleet import steps as st
from fleet.choices import FINISHED_JOB_STATES, ActionKind, ActionState
from fleet.cluster.base import WAITING, ClusterAdapter, ClusterUnavailable, StepFailed
from fleet.cluster.registry import get_adapter
from fleet.models import Action, Job, Node
from fleet.services import audit
from fleet.services.actions import lifecycle
from fleet.services.actions import rules as step_rules
from fleet.services.actions.propose import check_plan, expire, log_entry, redecide
from fleet.services.errors import ServiceError
from fleet.services.execution import cluster_sync, rollback
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.steps import Step, StepError

log = logging.getLogger(__name__)

# Backoff of a step the cluster could not be reached for: 2, 4, 8 ... 60 s.
RETRY_BASE_S = 2
RETRY_MAX_S = 60
RETRYING = "retrying"


# --- executing ------------------------------------------------------------------


@dataclass
class StepResult:
    more: bool
    message: str = ""
    # Seconds after which the caller should run the action again (the cluster
    # was unreachable); None: nothing to schedule.
    retry_in: float | None = None


DONE_ELSEWHERE = "step done elsewhere"


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
        action.state == ActionState.APPROVED
        or (action.state == ActionState.EXECUTING and action.step_index == 0)
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
    if (
        action.state == ActionState.APPROVED
        and lifecycle.transition(None, action.pk, ActionState.EXECUTING, quiet=True) is None
    ):
        return StepResult(False, "claimed elsewhere")
    return None


def execute_next_step(
    action_id: int, adapter: ClusterAdapter | None = None, *, begun: bool = False
) -> StepResult:
    """Carry out the next step of an approved or executing action.

    1. An approved action is checked against the current fleet; a plan that no
       longer holds is marked expired (and a new decision is requested).
    2. The adapter does the step in the cluster (it may say: wait, for a
       callback). A cluster that cannot be reached leaves the action executing
       at this step, with a log entry, and the caller is told when to try again
       (``retry_in``); a step the cluster refuses fails the action, and the
       jobs it stopped run again (:func:`fleet.services.execution.rollback.roll_back`).
    3. Under the action's row lock, the step's database change is applied (its
       rule in :mod:`fleet.services.actions.rules`), the job's id in the cluster stored
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
        outcome = adapter.perform(
            action, index, as_handed(step), lambda done: lifecycle.step_progress(action, index, done)
        )
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


def as_handed(step: Step) -> Step:
    """``step`` as the cluster adapter is handed it: naming the hosts it acts
    on, read from the fleet now (the job's allocation rows, the nodes' names).
    A plan stores where it puts a job (its allocate step) but not where the job
    is when a later step runs; the rows say that, and adapters read no rows for
    it."""
    if isinstance(step, st.Start | st.Restart | st.Swap) and step.job is not None:
        hosts, segments = job_allocations.hosts_held(step.job)
        if isinstance(step, st.Swap):
            pairs = step.hostname_swaps or {_hostname(a): _hostname(b) for a, b in step.swaps.items()}
            return replace(step, hostnames=hosts, hostname_swaps=pairs)
        return replace(step, hostnames=hosts, segments=segments)
    if isinstance(step, st.Allocate) and not step.hostnames:
        return replace(step, hostnames=[_hostname(n) for n in step.nodes])
    if isinstance(step, st.Drain | st.Undrain) and not step.hostname:
        return replace(step, hostname=_hostname(step.node))
    return step


def _hostname(node_id: int) -> str:
    name = Node.objects.filter(pk=node_id).values_list("hostname", flat=True).first()
    if name is None:
        raise StepFailed(f"node {node_id} no longer exists")
    return name


# Plans that stop or move jobs to make room: a job that ends by itself while
# the plan runs has made its room, and its remaining steps are skipped (the
# soak saw a defrag plan fail, after moving one job, on the stop of a job that
# had just completed).
MOOT_WHEN_ENDED = (
    ActionKind.DEFRAG,
    ActionKind.EVACUATION,
    ActionKind.MIGRATION,
    ActionKind.PREEMPTION,
    ActionKind.RECLAIM,
)


def _ended_meanwhile(action: Action, step: Step) -> str | None:
    """Why ``step`` of ``action`` has nothing left to do (its job ended), or None."""
    if action.kind not in MOOT_WHEN_ENDED or step.job is None:
        return None
    state = Job.objects.filter(pk=step.job).values_list("state", flat=True).first()
    if state not in FINISHED_JOB_STATES:
        return None
    return f"skipped: job #{step.job} ended ({state}) before this step; the room it held is free"


def _commit_step(
    action_id: int,
    index: int,
    steps: list,
    step: Step,
    *,
    external_id: str | None = None,
    skipped: str | None = None,
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
        entry = log_entry(index, step, "skipped" if skipped else "done", skipped or "")
        locked.log = [*locked.log, entry]
        locked.save(update_fields=["step_index", "progress", "step_started_at", "log", "updated_at"])
        audit.record(
            None,
            "action.step",
            locked,
            after={"step": index, "op": step.op, "status": entry["status"]},
            message=entry["message"],
        )
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
        entry = log_entry(
            index, step, RETRYING, f"cluster unavailable, retrying in {delay} s: {error}"[:1000]
        )
        entry["retries"] = retries
        kept = action.log[:-1] if retries > 1 else action.log
        action.log = [*kept, entry]
        action.save(update_fields=["log", "updated_at"])
        events.actions_changed([action.pk])
    log.warning(
        "action #%s step %s: cluster unavailable, retrying in %s s: %s", action_id, index, delay, error
    )
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
    successor = redecide(
        None, action, [f"stale before its first step: {'; '.join(problems)}"], keep_approval=True
    )
    if successor is None:
        return StepResult(False, "expired")
    return StepResult(False, f"re-planned as #{successor.pk} ({successor.state})")


def _failed_entry(index: int, op: str, error: str) -> dict:
    return {"at": timezone.now().isoformat(), "step": index, "op": op, "status": "failed", "message": error}
