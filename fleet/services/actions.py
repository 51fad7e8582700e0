"""Actions: decisions as ordered steps, approved by policy or by an operator, and
carried out one step at a time.

Every state change goes through :mod:`fleet.services.action_lifecycle` (a row
lock and a check against its table of transitions), so a task delivered twice
does the work once and every end is audited, announced and settled alike.

Step ops and what each does to the database (after the executor has done its
part in the cluster):

=========== ========================================================
allocate    bind a pending job to the planned GPUs (``apply_placement``)
start       the job's processes are up: placed|recovering -> running
restart     same as start, after a swap (restart from the checkpoint)
checkpoint  nothing in the database (the executor checkpoints)
stop        release the job's GPUs; it waits, held by this action
preempt     release a victim's GPUs; it goes back to the queue
requeue     release the job's GPUs; it goes back to the queue
swap        move the job off failed nodes onto spares in the same rack
drain       drain a node
=========== ========================================================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from fleet import engine, events
from fleet.choices import (
    HOLDING_JOB_STATES,
    OPEN_ACTION_STATES,
    ActionKind,
    ActionState,
    ApprovalMode,
    JobState,
    NodeState,
    Role,
)
from fleet.models import Action, ApprovalPolicy, Job, Node, Rack
from fleet.permissions import has_role
from fleet.services import action_lifecycle as lifecycle
from fleet.services import audit
from fleet.services import jobs as job_services
from fleet.services import nodes as node_services
from fleet.services.errors import InvalidInput, NotAllowed, ServiceError
from placement import model as pm
from placement.validate import validate

log = logging.getLogger(__name__)


class StepFailed(Exception):
    """The executor could not carry out a step."""


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
    steps: list[dict]
    jobs: list[int]
    engine_plan: dict | None = None
    cost_gpu_hours: float = 0.0
    benefit: dict | None = None
    done_steps: int = 0


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
        auto = modes[p.kind] == ApprovalMode.AUTO
        rows.append(
            Action(
                kind=p.kind,
                title=p.title[:300],
                plan={"steps": p.steps, "engine": p.engine_plan or {}},
                cost_gpu_hours=round(p.cost_gpu_hours, 4),
                benefit=p.benefit or {},
                fleet_version=version,
                proposed_by=actor if actor is not None and actor.pk else None,
                proposed_by_name=audit.actor_name(actor),
                state=ActionState.EXECUTING if p.done_steps else (ActionState.APPROVED if auto else ActionState.PROPOSED),
                decided_by_name="policy (auto)" if auto else "",
                decided_at=now if auto else None,
                step_index=p.done_steps,
                progress=p.done_steps / len(p.steps) if p.steps else 1.0,
                started_at=now if p.done_steps else None,
                log=[_log_entry(i, s, "done") for i, s in enumerate(p.steps[: p.done_steps])],
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


def approve(actor, action_id: int, note: str = "") -> Action:
    """proposed -> approved; a worker starts executing it on commit."""
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
    """Replay the remaining steps on a fresh snapshot of the fleet and run the
    engine's invariant checker on the jobs they touch. Returns the problems
    (empty: the plan still holds)."""
    steps = action.steps[action.step_index:] if steps is None else steps
    snap = engine.load_snapshot()
    fleet = snap.fleet
    jobs = {str(j.pk): j for j in Job.objects.select_related("tenant").filter(pk__in=[s["job"] for s in steps if "job" in s])}
    problems: list[str] = []
    touched: set[str] = set()
    stopped: set[str] = set()
    for step in steps:
        op = step["op"]
        if op == "drain":
            state = Node.objects.filter(pk=step["node"]).values_list("state", flat=True).first()
            if state not in (NodeState.HEALTHY, NodeState.SUSPECT):
                problems.append(f"node {step['node']} is {state}, it can no longer be drained")
            continue
        jid = str(step["job"])
        job = jobs.get(jid)
        if job is None:
            problems.append(f"job #{jid} no longer exists")
            continue
        touched.add(jid)
        held = jid in fleet.allocations
        if op == "allocate":
            if job.state != JobState.PENDING and jid not in stopped:
                problems.append(f"job #{jid} is {job.state}, no longer pending")
                continue
            try:
                fleet.allocate(pm.Allocation(engine.job_request(job), {k: tuple(v) for k, v in step["nodes"].items()}, step.get("segments") or []))
            except pm.CapacityError as exc:
                problems.append(f"job #{jid}: {exc}")
        elif op in ("stop", "preempt", "requeue"):
            if not held:
                problems.append(f"job #{jid} holds no GPUs any more")
                continue
            fleet.release(jid)
            stopped.add(jid)
        elif op == "swap":
            if not held or job.state not in HOLDING_JOB_STATES:
                problems.append(f"job #{jid} holds no GPUs any more")
                continue
            old = fleet.release(jid)
            nodes: dict[str, tuple[int, ...]] = {}
            for nid, gpus in old.nodes.items():
                new = step["swaps"].get(nid, nid)
                if new != nid:
                    target = fleet.nodes.get(new)
                    if target is None or target.free_gpus < len(gpus):
                        problems.append(f"job #{jid}: replacement node {snap.hostnames.get(new, new)} is no longer free")
                        break
                    gpus = target.free_indices(len(gpus))
                nodes[new] = gpus
            else:
                segments = [[step["swaps"].get(n, n) for n in seg] for seg in old.segments]
                fleet.allocate(pm.Allocation(old.job, nodes, segments), restore=True)
        elif op in ("start", "restart"):
            if jid not in fleet.allocations:
                problems.append(f"job #{jid} would start without GPUs")
    if not problems:
        scope = {j: fleet.allocations[j] for j in touched if j in fleet.allocations}
        problems += [str(v) for v in validate(fleet, scope)]
    return problems


# --- executing ------------------------------------------------------------------


@dataclass
class StepResult:
    more: bool
    message: str = ""


def _log_entry(index: int, step: dict, status: str, message: str = "") -> dict:
    return {
        "at": timezone.now().isoformat(),
        "step": index,
        "op": step["op"],
        "status": status,
        "message": message or describe_step(step),
    }


def describe_step(step: dict) -> str:
    op = step["op"]
    if op == "drain":
        return f"drain node {step.get('hostname', step['node'])}"
    target = f"job #{step['job']}"
    if op == "allocate":
        return f"allocate {target} on {', '.join(step.get('hostnames', [])) or 'its nodes'}"
    if op == "swap":
        pairs = step.get("hostname_swaps") or step["swaps"]
        return f"swap {target}: " + ", ".join(f"{a} -> {b}" for a, b in pairs.items())
    return f"{op} {target}"


def _apply_step(actor, action: Action, step: dict) -> None:
    """The database side of one step (see the module docstring)."""
    op = step["op"]
    why = f"action #{action.pk} ({action.kind})"
    if op == "allocate":
        job_services.apply_placement(
            actor,
            step["job"],
            {int(k): v for k, v in step["nodes"].items()},
            reason=step.get("reason") or why,
            segments=step.get("segments"),
            choices=step.get("choices"),
        )
    elif op in ("start", "restart"):
        job_services.start_job(actor, step["job"])
    elif op == "checkpoint":
        pass
    elif op == "stop":
        job_services.requeue_job(actor, step["job"], reason=f"moving: {why}", action="job.stop")
    elif op == "preempt":
        job_services.requeue_job(actor, step["job"], reason=f"preempted by {why}", action="job.preempt")
    elif op == "requeue":
        job_services.requeue_job(actor, step["job"], reason=step.get("reason") or f"requeued by {why}")
    elif op == "swap":
        job_services.swap_job_nodes(
            actor, step["job"], {int(k): int(v) for k, v in step["swaps"].items()}, reason=f"recovering: {why}"
        )
    elif op == "drain":
        node_services.drain_node(actor, step["node"], step.get("reason") or why)
    else:
        raise StepFailed(f"unknown step op {op!r}")


def execute_next_step(action_id: int, executor=None) -> StepResult:
    """Carry out the next step of an approved or executing action.

    1. An approved action is checked against the current fleet; a plan that no
       longer holds is marked expired (and a new decision is requested).
    2. The executor does the step in the cluster (it may say: wait for a callback).
    3. Under the action's row lock, the step's database change is applied and the
       step counted, in one transaction; a second worker finds the step done.
    Returns whether more steps remain for this call to make.
    """
    from fleet.executors import WAITING, get_executor

    executor = executor or get_executor()
    action = Action.objects.filter(pk=action_id).first()
    if action is None:
        return StepResult(False, "gone")
    if action.state == ActionState.APPROVED:
        problems = check_plan(action)
        if problems:
            expire(None, action.pk, problems)
            return StepResult(False, "expired")
        claimed = lifecycle.transition(None, action.pk, ActionState.EXECUTING, quiet=True)
        if claimed is None:
            return StepResult(False, "claimed elsewhere")
        action = claimed
    if action.state != ActionState.EXECUTING:
        return StepResult(False, action.state)
    steps = action.steps
    index = action.step_index
    if index >= len(steps):
        _finish(action.pk)
        return StepResult(False, "succeeded")
    step = steps[index]
    try:
        outcome = executor.perform(action, index, step)
    except StepFailed as exc:
        _fail(action.pk, index, step, str(exc))
        return StepResult(False, "failed")
    if outcome == WAITING:
        return StepResult(False, "waiting for the executor's callback")
    try:
        with transaction.atomic():
            locked = Action.objects.select_for_update().get(pk=action.pk)
            if locked.state != ActionState.EXECUTING or locked.step_index != index:
                return StepResult(False, "step done elsewhere")
            _apply_step(None, locked, step)
            locked.step_index = index + 1
            locked.progress = (index + 1) / len(steps)
            locked.step_started_at = None
            locked.log = [*locked.log, _log_entry(index, step, "done")]
            locked.save(update_fields=["step_index", "progress", "step_started_at", "log", "updated_at"])
            audit.record(None, "action.step", locked, after={"step": index, "op": step["op"]}, message=describe_step(step))
            events.actions_changed([locked.pk])
    except ServiceError as exc:
        _fail(action.pk, index, step, str(exc))
        return StepResult(False, "failed")
    executor.after_step(action, index, step)
    if index + 1 >= len(steps):
        _finish(action.pk)
        return StepResult(False, "succeeded")
    return StepResult(True)


def _finish(action_id: int) -> None:
    lifecycle.transition(None, action_id, ActionState.SUCCEEDED, fields={"progress": 1.0}, quiet=True)


def _fail(action_id: int, index: int, step: dict, error: str) -> None:
    message = f"step {index + 1} ({step['op']}) failed: {error}"
    with transaction.atomic():
        action = Action.objects.select_for_update().get(pk=action_id)
        failed = lifecycle.transition(
            None,
            action_id,
            ActionState.FAILED,
            message=message,
            fields={"error": message, "log": [*action.log, _log_entry(index, step, "failed", error)]},
            quiet=True,
        )
    if failed is not None:
        log.warning("action #%s failed: %s", action_id, error)


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
