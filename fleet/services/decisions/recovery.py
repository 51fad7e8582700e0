"""Turning a failed node under a running job into a recovery decision."""

from __future__ import annotations

import dataclasses
import logging

from fleet import engine
from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Job
from fleet.services.actions import propose as action_services
from fleet.services.actions.lifecycle import HOLD_KINDS
from fleet.services.jobs import allocations as job_allocations
from fleet.steps import Preempt, Requeue, Restart, Start, Step, Stop, Swap
from placement import model as pm
from placement.recover import recover, restart_cost_gpu_hours
from placement.validate import validate_recovery

log = logging.getLogger(__name__)

KIND_BY_ENGINE_ACTION = {
    "swap": ActionKind.RECOVERY,
    "preempt_swap": ActionKind.PREEMPTION,
    "move": ActionKind.MIGRATION,
    "requeue": ActionKind.REQUEUE,
}


class InvalidPlan(Exception):
    """The engine's recovery plan broke an invariant (a bug; logged)."""


def plan_recovery(job_id: int) -> Action | None:
    """Propose how to recover a job interrupted by failed nodes.

    1. Skip a job that is not recovering or is already held by an open action.
    2. Ask the engine (see :func:`recovery_proposal`).
    3. Propose it as steps; the approval policy decides whether it runs at once
       (in-place swaps do by default) or waits for an operator (preemptions,
       migrations). A waiting proposal is re-checked as the fleet changes
       (:mod:`fleet.services.decisions.recheck`).
    """
    job = Job.objects.select_related("tenant").filter(pk=job_id).first()
    if job is None or job.state != JobState.RECOVERING or job.pk in action_services.open_action_job_ids():
        return None
    try:
        proposal = recovery_proposal(job)
    except InvalidPlan:
        job_allocations.requeue_job(None, job.pk, reason="recovery plan refused by the invariant checker")
        return None
    if proposal is None:
        return None
    return action_services.propose_many([proposal])[0]


def recovery_proposal(job: Job) -> action_services.Proposal | None:
    """What recovering ``job`` takes on the fleet as it is now, as a proposal
    (nothing is recorded). None: nothing to do. Raises InvalidPlan if the
    engine's plan fails the invariant checker.

    1. A job that holds nothing any more (drift) goes back to the queue.
    2. One whose nodes are all healthy again restarts in place.
    3. Else the engine: swap the failed nodes for spares in the same rack; else
       preempt lower-priority jobs there; else move the whole job; else requeue.
       Nodes held for a plan are not spares (the engine sees them draining), and
       the jobs a plan is moving are not victims.
    """
    # The in-memory fleet brought up to date (a full load is 0.7 s at 1,000 racks);
    # the engine tries its moves in a trial, which leaves it as it was.
    with engine.live_snapshot() as snap, snap.fleet.trial():
        _protect_moving_jobs(snap.fleet, exclude=str(job.pk))
        return _proposal(snap, job)


def _protect_moving_jobs(fleet: pm.Fleet, *, exclude: str) -> None:
    """Inside a trial: the jobs an approved or executing plan is moving count as
    not preemptible, so recovery never picks one as a victim (the plan holds them
    as it holds their nodes; see fleet.services.actions.lifecycle). Their nodes
    are held already, so the engine cannot swap into them either."""
    moving = Action.jobs.through.objects.filter(
        action__state__in=(ActionState.APPROVED, ActionState.EXECUTING), action__kind__in=HOLD_KINDS
    ).values_list("job_id", flat=True)
    for jid in {str(j) for j in moving} - {exclude}:
        alloc = fleet.allocations.get(jid)
        if alloc is not None and alloc.job.preemptible:
            fleet.release(jid)
            fleet.allocate(
                dataclasses.replace(alloc, job=dataclasses.replace(alloc.job, preemptible=False)),
                restore=True,
            )


def _proposal(snap: engine.Snapshot, job: Job) -> action_services.Proposal | None:
    fleet = snap.fleet
    jid = str(job.pk)
    alloc = fleet.allocations.get(jid)
    if alloc is None:
        # Holds nothing any more (drift): back to the queue.
        return action_services.Proposal(
            kind=ActionKind.REQUEUE,
            title=f"requeue job #{job.pk} {job.name}: it holds no GPUs",
            steps=[Requeue(job=job.pk, reason="recovering without GPUs")],
            jobs=[job.pk],
        )
    failed = [nid for nid in alloc.nodes if fleet.nodes[nid].health == pm.FAILED]
    if not failed:
        # The node came back before recovery ran: restart in place.
        return action_services.Proposal(
            kind=ActionKind.RECOVERY,
            title=f"restart job #{job.pk} {job.name} in place: its nodes are healthy again",
            steps=[Restart(job=job.pk)],
            jobs=[job.pk],
            cost_gpu_hours=restart_cost_gpu_hours(alloc.job, alloc.gpus),
        )
    plan = recover(fleet, jid, failed, policy=engine.policy())
    if plan.action == "none":
        return None
    problems = validate_recovery(fleet, plan)
    if problems:
        log.error("recovery plan for job %s violates invariants: %s", job.pk, problems)
        raise InvalidPlan("; ".join(str(p) for p in problems))
    steps: list[Step] = []
    jobs = [job.pk]
    cost = restart_cost_gpu_hours(alloc.job, alloc.gpus)
    for victim in plan.preempted:
        victim_alloc = fleet.allocations[victim]
        cost += restart_cost_gpu_hours(victim_alloc.job, victim_alloc.gpus)
        steps.append(Preempt(job=int(victim)))
        jobs.append(int(victim))
    if plan.action in ("swap", "preempt_swap"):
        steps.append(
            Swap(
                job=job.pk,
                # By database id, as the step stores them (the engine's are strings).
                swaps={int(a): int(b) for a, b in plan.swaps.items()},
                hostname_swaps={snap.hostnames[a]: snap.hostnames[b] for a, b in plan.swaps.items()},
            )
        )
        steps.append(Restart(job=job.pk))
        title = f"recover job #{job.pk} {job.name} in place: " + ", ".join(
            f"{snap.hostnames[a]} -> {snap.hostnames[b]}" for a, b in plan.swaps.items()
        )
    elif plan.action == "move":
        steps += [
            Stop(job=job.pk),
            snap.allocate_step(job.pk, plan.new_nodes, plan.new_segments, plan.reason),
            Start(job=job.pk),
        ]
        title = (
            f"move job #{job.pk} {job.name} to "
            f"{', '.join(sorted({snap.rack_names[fleet.nodes[n].rack] for n in plan.new_nodes}))}"
        )
    else:
        steps.append(Requeue(job=job.pk, reason=plan.reason))
        title = f"requeue job #{job.pk} {job.name}: {plan.reason}"
    return action_services.Proposal(
        kind=KIND_BY_ENGINE_ACTION[plan.action],
        title=title,
        steps=steps,
        jobs=jobs,
        engine_plan=plan.to_dict(),
        cost_gpu_hours=cost,
        benefit={"reason": plan.reason},
    )
