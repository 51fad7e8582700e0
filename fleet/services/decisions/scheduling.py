"""The scheduling pass: place pending jobs with the placement engine.

One pass at a time fleet-wide (the caller holds the decision lock, see
fleet.locks); allocations are still guarded by the database constraint. The
caller's ``checkpoint`` runs inside every transaction that records decisions,
just before it commits: a pass whose lock was lost raises there and stops with
nothing more committed."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast

from django.db import transaction
from django.utils import timezone

from fleet import dispatch, engine
from fleet.choices import ActionKind, ActionState, ApprovalMode, JobState, Locality
from fleet.models import Action, ApprovalPolicy, Job, NodeHold
from fleet.services.actions import propose as action_services
from fleet.services.decisions import admission
from fleet.services.decisions.recheck import filling
from fleet.services.errors import Conflict
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.jobs import submit as job_services
from fleet.services.jobs.capacity import fleet_capacity, normalise_shape
from fleet.steps import Allocate, Start
from placement import model as pm
from placement import schedule
from placement.place import what_if as engine_what_if
from placement.plans import PlacementPlan
from placement.validate import Violation, validate

log = logging.getLogger(__name__)

# After an operator rejects a cross-rack placement, the job waits for a rack-local
# slot for this long before a spill is proposed again.
SPILL_COOLDOWN = timedelta(minutes=15)


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)


def _spills(plan: PlacementPlan, job: pm.JobRequest, fleet: pm.Fleet) -> bool:
    """Does the placement use more racks than the job needs? A job in segments
    asked for each segment inside one rack and no more (the invariant checker has
    seen to that), so its segments over several racks are no spill."""
    if len(plan.racks) <= 1:
        return False
    gpn = fleet.nodes[next(iter(plan.nodes))].gpus
    if job.segment_nodes and job.segment_nodes < job.nodes_needed(gpn):
        return False
    size = max(r.size for r in fleet.groups.get(gpn, fleet.racks))
    return len(plan.racks) > pm.racks_needed(job.nodes_needed(gpn) or 1, size)


def _describe(plan: PlacementPlan, snap: engine.Snapshot) -> str:
    racks = ", ".join(snap.describe_racks(plan.racks))
    return f"{len(plan.nodes)} node(s) in {racks}"


Checkpoint = Callable[[], None]


def _no_checkpoint() -> None:
    """Without a lease (tests, a caller that holds no lock) there is nothing to check."""


def schedule_pass(checkpoint: Checkpoint = _no_checkpoint) -> PassResult:
    """Place every pending job that may start now, in queue order.

    1. Snapshot the fleet (the in-memory one, brought up to date: fleet.engine.
       LiveFleet); leave out jobs an open action already holds (a plan's moved
       jobs among them). Nodes held for a plan take no new work (the engine
       sees them draining, and the records re-read the holds).
    2. Ask the engine for a queue pass (look-ahead and backfill included).
    3. For each placement, re-check it with the invariant checker against the
       fleet as the earlier placements of this pass left it.
    4. A placement that keeps locality is allocated right away (auto policy) and
       its start handed to the cluster adapter; one that spreads a preferred job over
       more racks than needed waits for an operator (manual policy).
    5. Jobs that wait get their reason in words.
    Each commit is preceded by ``checkpoint()`` (see the module docstring).
    """
    result = PassResult()
    busy = action_services.open_action_job_ids()
    pending = list(Job.objects.select_related("tenant").filter(state=JobState.PENDING).exclude(pk__in=busy))
    if not pending:
        return result
    recent_refusals = set(
        Action.jobs.through.objects.filter(
            action__kind=ActionKind.PLACEMENT_SPILL,
            action__state=ActionState.REJECTED,
            action__decided_at__gte=timezone.now() - SPILL_COOLDOWN,
        ).values_list("job_id", flat=True)
    )
    admitted = admission.admit(pending, busy)
    by_id = {job.pk: job for job in pending}
    for job_id, reason in admitted.waiting.items():
        result.waiting[job_id] = reason
        _set_reason(by_id[job_id], reason)
    pending = admitted.jobs
    requests = {}
    for job in pending:
        request = engine.job_request(job)
        if job.pk in recent_refusals and request.locality == Locality.PREFERRED:
            request = dataclasses.replace(request, locality=Locality.REQUIRED)
        requests[request.id] = request
    with engine.live_snapshot() as snap:
        # A job placed since the queue was read (by another pass: only under a
        # lost lease) holds GPUs in the snapshot; it is not pending any more.
        pending = [job for job in pending if str(job.pk) not in snap.fleet.allocations]
        requests = {jid: r for jid, r in requests.items() if jid not in snap.fleet.allocations}
        # Plan, then record, each on the in-memory fleet inside a trial: what the
        # pass tries leaves nothing behind; what it commits comes back as changed
        # racks on the next snapshot.
        with snap.fleet.trial():
            plan = schedule(snap.fleet, list(requests.values()), engine.policy(), now=time.time(), apply=True)
        with snap.fleet.trial():
            _record(plan, pending, requests, snap, checkpoint, result)
            _reclaim(admitted, result, snap, busy, checkpoint)
    return result


def _reclaim(
    admitted: admission.Admitted,
    result: PassResult,
    snap: engine.Snapshot,
    busy: set[int],
    checkpoint: Checkpoint,
) -> None:
    """Preemption plans for admitted jobs the pass could not place (see
    fleet.services.decisions.admission), recorded in one transaction."""
    proposals = admission.propose_reclaims(admitted, result.waiting, snap, busy)
    if not proposals:
        return
    with transaction.atomic():
        action_services.propose_many(proposals)
        checkpoint()
    for p in proposals:
        job_id = p.jobs[0]
        result.proposed.append(job_id)
        result.waiting.pop(job_id, None)


def _record(
    plan,
    pending: list[Job],
    requests: dict,
    snap: engine.Snapshot,
    checkpoint: Checkpoint,
    result: PassResult,
) -> None:
    """Check each of the plan's placements against the fleet as the earlier ones
    left it, and record it: allocated now, or proposed to an operator."""
    by_id = {str(j.pk): j for j in pending}
    modes = {
        kind: ApprovalPolicy.mode_for(kind) for kind in (ActionKind.PLACEMENT, ActionKind.PLACEMENT_SPILL)
    }
    version = action_services.fleet_version()
    auto: list[action_services.Proposal] = []
    manual: list[action_services.Proposal] = []
    for placement_plan in plan.placements:
        job, request = by_id[placement_plan.job_id], requests[placement_plan.job_id]
        # The invariant checker on the new allocation (gang whole, locality,
        # segments, healthy nodes), and the fleet model refusing any GPU already
        # held by the pass so far: together, the whole fleet stays valid without
        # re-checking every allocation for every job.
        allocation = placement_plan.allocation(request)
        violations: Sequence[Violation | str] = validate(snap.fleet, {request.id: allocation})
        try:
            if not violations:
                snap.fleet.allocate(allocation)
        except pm.CapacityError as exc:
            violations = [str(exc)]
        if violations:
            log.error("engine plan for job %s violates invariants: %s", job.pk, violations)
            result.waiting[job.pk] = "placement refused by the invariant checker"
            continue
        kind = (
            ActionKind.PLACEMENT_SPILL
            if _spills(placement_plan, request, snap.fleet)
            else ActionKind.PLACEMENT
        )
        proposal = action_services.Proposal(
            kind=kind,
            title=f"place job #{job.pk} {job.name}: {_describe(placement_plan, snap)}",
            steps=[
                snap.allocate_step(
                    job.pk,
                    placement_plan.nodes,
                    placement_plan.segments,
                    placement_plan.reason,
                    placement_plan.choices,
                ),
                Start(job=job.pk),
            ],
            jobs=[job.pk],
        )
        if modes[kind] == ApprovalMode.MANUAL:
            manual.append(proposal)
            _set_reason(job, "waiting for an operator to approve a placement across racks")
        else:
            auto.append(proposal)

    if manual:
        with transaction.atomic():
            action_services.propose_many(manual, version=version)
            checkpoint()
    result.proposed = [p.jobs[0] for p in manual]
    result.placed = _place_auto(auto, version, checkpoint)
    _recheck_plans_filling(auto, result.placed, snap)
    for job_id, reason in plan.waiting.items():
        job = by_id[job_id]
        result.waiting[job.pk] = reason
        _set_reason(job, reason)


def _allocate_of(proposal: action_services.Proposal) -> Allocate:
    """A placement's first step: its allocate (built by the pass above)."""
    return cast(Allocate, proposal.steps[0])


def _place_auto(auto: list[action_services.Proposal], version: int, checkpoint: Checkpoint) -> list[int]:
    """Allocate the pass's automatic placements (each proposal's first step, its
    allocate) and record their actions, in one transaction. If the batch
    conflicts with a change made meanwhile (a GPU taken), fall back to one job
    at a time so the others still go through."""
    if not auto:
        return []
    auto = _off_held_nodes(auto)
    try:
        with transaction.atomic():
            placed, refused = job_allocations.place_jobs(None, [_allocate_of(p) for p in auto])
            for job_id, why in refused.items():
                log.info("placement of job %s skipped: %s", job_id, why)
            done = {job.pk for job in placed}
            proposals = [p for p in auto if p.jobs[0] in done]
            for p in proposals:
                p.done_steps = 1
            action_services.propose_many(proposals, version=version)
            checkpoint()
        return sorted(done)
    except Conflict:
        pass
    placed_ids = []
    for proposal in auto:
        job_id = proposal.jobs[0]
        try:
            with transaction.atomic():
                placed, refused = job_allocations.place_jobs(None, [_allocate_of(proposal)])
                if refused:
                    raise Conflict(refused[job_id])
                proposal.done_steps = 1
                action_services.propose_many([proposal], version=version)
                checkpoint()
            placed_ids.append(job_id)
        except Conflict as exc:
            # Someone changed the fleet under us; the next pass decides again.
            log.info("placement of job %s skipped: %s", job_id, exc)
    return placed_ids


def _off_held_nodes(auto: list[action_services.Proposal]) -> list[action_services.Proposal]:
    """The placements that land on no node held for a plan. The engine already
    sees held nodes as taking no new work (fleet.engine); this reads the holds
    again as the pass records, so a hold taken since the snapshot (by a caller
    that did not wait for the decision lock) still wins. The next pass decides
    again for a job left out."""
    nodes = {int(n) for p in auto for n in _allocate_of(p).nodes}
    held = dict(NodeHold.objects.filter(node_id__in=nodes).values_list("node_id", "action_id"))
    if not held:
        return auto
    kept = []
    for proposal in auto:
        on = sorted({held[int(n)] for n in _allocate_of(proposal).nodes if int(n) in held})
        if on:
            log.info("placement of job %s skipped: its nodes are held for action(s) %s", proposal.jobs[0], on)
        else:
            kept.append(proposal)
    return kept


def _recheck_plans_filling(auto, placed: list[int], snap: engine.Snapshot) -> None:
    """New work placed where a waiting plan means to move jobs may have made it
    stale: ask for a recheck of those racks (the plan is re-planned in place, and
    its card shows the new one, before anyone approves the old)."""
    if not placed:
        return
    done = set(placed)
    racks = {
        int(snap.fleet.nodes[str(n)].rack) for p in auto if p.jobs[0] in done for n in _allocate_of(p).nodes
    }
    if filling(racks):
        dispatch.recheck_proposals_soon(sorted(racks))


def _set_reason(job: Job, reason: str) -> None:
    if job.state_reason != reason:
        job_lifecycle.note_waiting(job.pk, reason)


def segment_room(largest: int, num_nodes: int, segment: int) -> str:
    """The room a gang in segments has now, in words (the what-if and the job
    page): ``largest`` is :func:`placement.place.largest_free`'s node count."""
    return f"the free racks hold {largest} of its {num_nodes} nodes in whole segments of {segment}"


def _in_about(seconds: float) -> str:
    if seconds < 90:
        return "in about a minute"
    if seconds < 5400:
        return f"in about {round(seconds / 60)} min"
    if seconds < 2 * 86400:
        return f"in about {round(seconds / 3600)} h"
    return f"in about {round(seconds / 86400)} days"


def what_if(actor, spec: job_services.JobSpec) -> dict:
    """What would happen to this job if it were submitted now, without submitting
    it: the same checks as submission (tenant, shape, bounds by the fleet), then the
    engine on the current snapshot with the pending queue and the running jobs'
    expected ends (``placement.place.what_if``). Nothing is written."""
    tenant = job_services.resolve_tenant(actor, spec.tenant)
    shape = normalise_shape(spec, fleet_capacity())
    now = time.time()
    unsaved = job_services.unsaved_job(
        actor, spec, tenant, shape, submitted_at=datetime.fromtimestamp(now, tz=UTC)
    )
    request = dataclasses.replace(engine.job_request(unsaved), id="what-if")
    busy = action_services.open_action_job_ids()
    pending = [
        engine.job_request(job)
        for job in Job.objects.select_related("tenant").filter(state=JobState.PENDING).exclude(pk__in=busy)
    ]
    # The scheduler's in-memory fleet when this process has one (the web
    # process's own, brought up to date from the changed racks): a what-if is
    # asked as the form is filled in, and a full load is 0.5 s at 1,000 racks.
    with engine.live_snapshot() as snap:
        answer = _what_if_answer(
            snap, engine_what_if(snap.fleet, pending, request, now, engine.policy()), request, now
        )
    quota = admission.quota_check(unsaved)
    answer["quota"] = None if quota is None else {"admitted": quota.admitted, "reason": quota.reason}
    if quota is not None and not quota.admitted:
        # The engine's answer is moot: the quota holds it back before placement.
        answer.update(
            starts_now=False,
            summary=f"waits on its tenant's quota: {quota.reason}",
            reason=f"quota: {quota.reason}",
            placement=[],
            racks=[],
            expected_start=None,
            expected_start_in_s=None,
        )
    return answer


def _what_if_answer(snap: engine.Snapshot, answer, request: pm.JobRequest, now: float) -> dict:
    plan = answer.plan
    placed = []
    if plan is not None:
        for node_id, gpus in plan.nodes.items():
            node = snap.fleet.nodes[node_id]
            placed.append(
                {
                    "node_id": int(node_id),
                    "hostname": snap.hostnames.get(node_id, node_id),
                    "rack": snap.rack_names.get(node.rack, node.rack),
                    "gpus": list(gpus),
                }
            )
        first = snap.fleet.nodes[next(iter(plan.nodes))]
        if request.is_small(first.gpus):
            where = (
                f"{placed[0]['hostname']} in {placed[0]['rack']}, "
                f"{len(placed[0]['gpus'])} of its {first.gpus} GPUs"
            )
        else:
            where = "; ".join(
                f"{name}, {sum(p['rack'] == name for p in placed)} of {snap.fleet.rack_by_id[r].size} nodes"
                for r, name in zip(plan.racks, snap.describe_racks(plan.racks), strict=True)
            )
        summary = f"would start now on {where}"
    else:
        seg = request.segment_nodes
        if answer.unit == "nodes" and seg and request.num_nodes and seg < request.num_nodes:
            # It may spread its segments over racks: the room that counts is all of it.
            slice_ = segment_room(answer.largest_free, request.num_nodes, seg)
        else:
            slice_ = f"the largest free slice is {answer.largest_free} {answer.unit}"
        need = request.total_gpus if answer.unit == "GPUs" else request.num_nodes
        if answer.ahead and need and answer.largest_free >= need:
            slice_ += ", enough for it, but the jobs ahead of it come first"
        if answer.expected_start is None:
            when = "no expected start: the jobs it waits for give no expected duration"
        else:
            when = f"expected start {_in_about(answer.expected_start - now)}"
        behind = f" behind {answer.ahead} waiting job(s)" if answer.ahead else ""
        summary = f"waits{behind}: {slice_}; {when}"
    start = answer.expected_start
    return {
        "starts_now": plan is not None,
        "summary": summary,
        "reason": answer.reason,
        "placement": placed,
        "racks": snap.describe_racks(plan.racks) if plan else [],
        "expected_start": datetime.fromtimestamp(start, tz=UTC) if start is not None else None,
        "expected_start_in_s": max(0.0, round(start - now, 1)) if start is not None else None,
        "largest_free_slice": answer.largest_free,
        "largest_free_unit": answer.unit,
        "jobs_ahead": answer.ahead,
    }
