"""Entry points for placement: one job (:func:`place`) or a queue pass (:func:`schedule`)."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterable

from placement.model import HEALTHY, REQUIRED, Fleet, JobRequest
from placement.plans import PlacementPlan, SchedulePlan, WhatIf, not_placed
from placement.policies import POLICIES, Context
from placement.policies.common import fewest_racks, min_racks, segment_of
from placement.policies.rackwise import may_borrow, rack_room
from placement.policies.slurm_block import block_room
from placement.queues import Backfill, by_tier, decide, degraded_for, degraded_note, expansion_factor

DEFAULT_POLICY = "rackwise"
# A blocked gang gets a reservation once it has waited this long (Slurm has the same
# knob, bf_min_age_reserve): reserving at once cost the many small jobs more than it
# gave the big one on tracegen workloads.
RESERVE_AFTER_S = 6 * 3600.0
# rackwise's backfill reserves for the first gang that cannot start only (EASY
# backfill): on the real traces more reservations (sched/backfill makes up to
# bf_max_job_test) held more nodes idle for later gangs than they gave them.
RACKWISE_MAX_RESERVATIONS = 1
# lxf_order's run time for a job that gives no expected duration.
UNKNOWN_RUN_S = 24 * 3600.0


def place(
    fleet: Fleet,
    job: JobRequest,
    policy: str = DEFAULT_POLICY,
    *,
    seed: int = 0,
    rng: random.Random | None = None,
    reserved: Iterable[str] = (),
    reserved_until: float | None = None,
    exclude: Iterable[str] = (),
    now: float | None = None,
) -> PlacementPlan:
    """Decide where ``job`` goes under ``policy``; the fleet is not changed.

    Returns a plan with ``placed`` False and a reason when the job must wait.
    ``reserved`` racks keep their idle nodes (look-ahead) until ``reserved_until``: a
    job expected to end by then may use them (EASY backfill); ``now`` is the clock for
    policies that weigh waiting against spanning racks; ``exclude`` racks are not
    used at all. Deterministic for a seed.

    Racks reserved for tenants (``fleet.reservations``) are tried in tiers
    (:func:`placement.queues.by_tier`): the job's tenant's own first, another
    tenant's only when nothing else holds the job. A multi-node gang never goes to
    a rack whose NVLink fabric is degraded (``fleet.degraded``).
    """
    run = functools.partial(
        _place,
        fleet,
        job,
        policy,
        seed=seed,
        rng=rng,
        reserved=reserved,
        reserved_until=reserved_until,
        now=now,
    )
    skip = frozenset(exclude)
    avoid = degraded_for(fleet, job)
    if avoid:
        skip |= avoid
    if not fleet.reservations:
        plan = run(exclude=skip)
    else:
        plan = by_tier(fleet, job, lambda out: run(exclude=skip | out if skip else out))
    if avoid and not plan.placed:
        plan.reason += degraded_note(fleet, avoid)
    return plan


def _place(
    fleet: Fleet,
    job: JobRequest,
    policy: str,
    *,
    seed: int,
    rng: random.Random | None,
    reserved: Iterable[str],
    reserved_until: float | None,
    exclude: frozenset[str],
    now: float | None,
) -> PlacementPlan:
    """:func:`place` over the racks not in ``exclude``, reservations aside."""
    fn = POLICIES.get(policy)
    if fn is None:
        raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
    if (
        reserved_until is not None
        and now is not None
        and job.expected_duration is not None
        and now + job.expected_duration <= reserved_until
    ):
        reserved = ()  # it ends before the blocked job could start: backfill freely
    skip = exclude
    if (
        skip
        and 2 * len(skip) < len(fleet.racks)
        and skip not in fleet.reservation_tiers(job.tenant)
        and policy == "rackwise"
        and job.locality == REQUIRED
        and not any(job.is_small(gpn) for gpn in fleet.groups)
    ):
        # A rack-local gang takes idle nodes only: rackwise's choice over the racks
        # left is its choice over the whole fleet with the excluded racks' idle nodes
        # held back, which it reads from the indexes instead of scanning a filtered
        # list (the same plan: tests/placement/test_index.py). When most racks are
        # excluded, the filtered list is the shorter way.
        taken = fleet.hold_back(
            {rid: sorted(fleet.rack_by_id[rid].free) for rid in skip if rid in fleet.rack_by_id}
        )
        try:
            return _place(
                fleet,
                job,
                policy,
                seed=seed,
                rng=rng,
                reserved=reserved,
                reserved_until=reserved_until,
                exclude=frozenset(),
                now=now,
            )
        finally:
            fleet.give_back(taken)
    ctx = Context(rng, frozenset(reserved), now, seed)
    best: PlacementPlan | None = None
    reasons: list[str] = []
    for gpn, racks in fleet.groups_outside(skip).items():
        if not job.is_small(gpn) and job.nodes_needed(gpn) == 0:
            reasons.append(f"{gpn}-GPU nodes: job needs {job.gpus_per_node} GPUs per node")
            continue
        plan = fn(fleet, job, racks, ctx)
        if not plan.placed:
            reasons.append(plan.reason if len(fleet.groups) == 1 else f"{gpn}-GPU racks: " + plan.reason)
            continue
        # Mixed fleets: prefer the shape that needs the fewest racks, then fewest nodes.
        if best is None or (len(plan.racks), len(plan.nodes)) < (len(best.racks), len(best.nodes)):
            best = plan
    if best is None:
        return not_placed(job, policy, "; ".join(reasons) or "the fleet has no racks")
    return best


def can_ever_fit(fleet: Fleet, job: JobRequest) -> tuple[bool, str]:
    """Could the job be placed on this fleet if it were empty and healthy?"""
    for gpn in fleet.groups:
        if job.is_small(gpn):
            return True, "fits on one node"
        n = job.nodes_needed(gpn)
        if n == 0:
            continue
        seg = segment_of(job.segment_nodes, n)
        if fewest_racks(fleet.group_sizes(gpn), n, seg) is not None:
            return True, f"fits in {gpn}-GPU racks"
    return False, (
        f"needs {job.total_gpus} GPUs"
        f"{' in segments of ' + str(job.segment_nodes) if job.segment_nodes else ''}"
        "; more than the fleet can ever hold"
    )


def shape_key(job: JobRequest) -> tuple[object, ...]:
    """What a placement decision depends on besides the fleet: jobs with the same key
    fit or wait together (queue passes memoise refusals by it)."""
    return (job.num_gpus, job.num_nodes, job.gpus_per_node, job.segment_nodes, job.locality, job.preemptible)


def queue_order(jobs: Iterable[JobRequest]) -> list[JobRequest]:
    """Priority first, then submit time; jobs that tie are taken biggest first (best
    fit decreasing packs a batch far better than arrival order), then as given."""
    return sorted(jobs, key=lambda j: (-j.priority, j.submit_time or 0.0, -j.total_gpus))


def lxf_order(jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
    """rackwise's queue: priority first, then the largest expansion factor (the
    bounded slowdown a job has so far, :func:`placement.queues.expansion_factor`),
    then :func:`queue_order`'s ties. A job without an expected duration counts as
    running ``UNKNOWN_RUN_S``; one without a submit time as not having waited."""

    def key(j: JobRequest) -> tuple[float, float, float, int]:
        waited = now - j.submit_time if j.submit_time is not None else 0.0
        run = j.expected_duration if j.expected_duration is not None else UNKNOWN_RUN_S
        return (-j.priority, -expansion_factor(waited, run), j.submit_time or 0.0, -j.total_gpus)

    return sorted(jobs, key=key)


def schedule(
    fleet: Fleet,
    pending: Iterable[JobRequest],
    policy: str = DEFAULT_POLICY,
    *,
    now: float | None = None,
    seed: int = 0,
    rng: random.Random | None = None,
    apply: bool = False,
    reserve_after_s: float = 0.0,
) -> SchedulePlan:
    """One queue pass: start every pending job that may start now, in queue order.

    ``rackwise`` with a clock (``now``) runs one backfill cycle, as the simulator does
    (:class:`placement.queues.Backfill` with rackwise placement):

    1. Jobs are visited by priority, then expansion factor (:func:`lxf_order`).
    2. A job starts if rackwise can place it on nodes no reservation holds while it
       is expected to run (a job without an expected duration may not use reserved
       nodes at all).
    3. The first gang that cannot start, once it has waited ``reserve_after_s`` (0:
       at once), reserves the nodes it could have soonest, from the running jobs'
       ``expected_end`` (unknown: never free): EASY backfill, one reservation
       (``RACKWISE_MAX_RESERVATIONS``). Single-node jobs reserve nothing.
       ``plan.reservation`` names it.

    Baselines, and rackwise without a clock, start any job that fits, by priority,
    then submit time (best-effort FIFO).
    With ``apply`` the placements are recorded on ``fleet``; otherwise on a copy.
    """
    work = fleet if apply else fleet.copy()
    out = SchedulePlan(policy)
    if policy == "rackwise" and now is not None:
        _backfill_pass(work, list(pending), now, reserve_after_s, out)
        return out
    rng = rng or random.Random(seed)
    failed: dict[tuple[object, ...], str] = {}
    for job in queue_order(pending):
        if not work.idle_total and not any(work.partial.values()):
            out.waiting[job.id] = "no free GPU in the fleet"
            continue
        key = shape_key(job)
        if key in failed:
            out.waiting[job.id] = failed[key]
            continue
        plan = place(work, job, policy, rng=rng, now=now)
        if plan.placed:
            _start(work, job, plan, now)
            out.placements.append(plan)
            continue
        failed[key] = plan.reason
        out.waiting[job.id] = plan.reason
    return out


def _start(work: Fleet, job: JobRequest, plan: PlacementPlan, now: float | None) -> None:
    alloc = plan.allocation(job)
    if now is not None and job.expected_duration is not None:
        alloc.expected_end = now + job.expected_duration
    work.allocate(alloc)


def _backfill_pass(
    work: Fleet, pending: list[JobRequest], now: float, reserve_after_s: float, out: SchedulePlan
) -> None:
    bf = Backfill(
        work,
        now,
        POLICIES["rackwise"],
        "rackwise",
        room=rack_room,
        max_reservations=RACKWISE_MAX_RESERVATIONS,
    )
    failed: dict[tuple[object, ...], str] = {}
    for job in lxf_order(pending, now):
        run = job.expected_duration if job.expected_duration is not None else math.inf
        key = shape_key(job)
        reason = failed.get(key)  # capacity only shrinks during a pass
        if reason is None:
            plan = bf.try_start(job, run)
            if plan.placed:
                _start(work, job, plan, now)
                bf.started(job.id)
                out.placements.append(plan)
                continue
            reason = plan.reason
            if not bf.holds:
                failed[key] = reason  # nothing held: no job of this shape can start
            else:
                reason = _held_for(work, job, bf, run) or reason
        waited = now - job.submit_time if job.submit_time is not None else 0.0
        gang = not any(job.is_small(g) for g in work.groups)
        hold = (
            bf.reserve(job, run, job.submit_time or now, key) if gang and waited >= reserve_after_s else None
        )
        if hold is not None:
            if out.reservation is None:
                racks = sorted({work.nodes[n].rack for n in hold.nodes})
                out.reservation = {
                    "job_id": job.id,
                    "racks": racks,
                    "start": hold.start,
                    "nodes": sorted(hold.nodes),
                }
            reason += f"; nodes are reserved for it, expected free in {hold.start - now:.0f} s"
        out.waiting[job.id] = reason


def _held_for(work: Fleet, job: JobRequest, bf: Backfill, run: float) -> str | None:
    """Why ``job`` waits when only the reservations keep it from starting now (None
    when it could not start without them either): the policy's own reason would say
    no rack offers the nodes, which reads as a fleet without room."""
    if not decide(work, job, bf.fn, work.groups, bf.ctx, bf.name).placed:
        return None
    ahead = sorted((h for h in bf.holds if h.start < bf.now + run), key=lambda h: h.start)
    if not ahead:
        return None
    first = ahead[0]
    who = ", ".join(dict.fromkeys(h.job_id for h in ahead))
    why = (
        "it would still be running then"
        if math.isfinite(run)
        else "it gives no expected duration, so it may not use reserved nodes"
    )
    return (
        f"the room it needs now is held for job {who}, expected to start in "
        f"{max(first.start - bf.now, 0):.0f} s; {why}"
    )


# what_if: how far ahead a start is estimated, and how many waiting jobs ahead of
# the job are planned before it (a bound on the estimate's cost).
WHAT_IF_WINDOW_S = 7 * 24 * 3600.0
WHAT_IF_AHEAD = 200


def what_if(
    fleet: Fleet, pending: Iterable[JobRequest], job: JobRequest, now: float, policy: str = DEFAULT_POLICY
) -> WhatIf:
    """What would happen to ``job`` if it were submitted at ``now``; the fleet is not
    changed.

    1. The queue pass (:func:`schedule`) with ``job`` added to ``pending``: does it
       start now, and where?
    2. If it waits: on the fleet as that pass leaves it, reserve for each waiting job
       ahead of it in queue order (at most ``WHAT_IF_AHEAD``), then for it, every
       reservation from the running jobs' expected ends (conservative backfill, over
       ``WHAT_IF_WINDOW_S``). Its reservation's start is the expected start.
    """
    pending = list(pending)
    work = fleet.copy()
    plan = schedule(work, [*pending, job], policy, now=now, apply=True)
    largest, unit = largest_free(fleet, job)
    mine = next((p for p in plan.placements if p.job_id == job.id), None)
    if mine is not None:
        return WhatIf(job.id, mine, mine.reason, now, largest, unit)
    reason = plan.waiting.get(job.id, "it waits")
    waiting = [j for j in [*pending, job] if j.id in plan.waiting]
    ordered = lxf_order(waiting, now) if policy == DEFAULT_POLICY else queue_order(waiting)
    ahead = ordered[: ordered.index(job)]
    bf = Backfill(
        work,
        now,
        POLICIES[policy],
        policy,
        window_s=WHAT_IF_WINDOW_S,
        max_reservations=WHAT_IF_AHEAD + 1,
        room={"rackwise": rack_room, "slurm-block": block_room}.get(policy),
    )
    for other in ahead[-WHAT_IF_AHEAD:]:
        run = other.expected_duration if other.expected_duration is not None else math.inf
        bf.reserve(other, run, other.submit_time or now, shape_key(other))
    run = job.expected_duration if job.expected_duration is not None else math.inf
    hold = bf.reserve(job, run, now, shape_key(job))
    return WhatIf(job.id, None, reason, hold.start if hold else None, largest, unit, len(ahead))


def largest_free(fleet: Fleet, job: JobRequest) -> tuple[int, str]:
    """The largest slice ``job`` could use now, in ``unit``: for a gang the most idle
    nodes one rack offers it (its spares kept unless it may borrow them); for a gang
    in segments (fewer nodes than the gang) the nodes all racks offer in whole
    segments, which it may spread over; for a single-node job the most free GPUs on
    one node. A gang that waits for room finds it smaller than itself."""
    best, unit = 0, "nodes"
    for gpn, racks in fleet.groups.items():
        if job.is_small(gpn):
            unit = "GPUs"
            best = max([best] + [n.free_gpus for r in racks for n in r.nodes if n.health == HEALTHY])
        elif job.nodes_needed(gpn):
            n = job.nodes_needed(gpn)
            seg = segment_of(job.segment_nodes, n)
            offers = [
                r.free_count if may_borrow(r, n, job.preemptible, seg) else r.slice_offer() for r in racks
            ]
            if seg and seg < n:
                best = max(best, sum(o // seg * seg for o in offers))
            else:
                best = max([best, *offers])
    return best, unit


def reservation(fleet: Fleet, job: JobRequest, now: float | None) -> tuple[frozenset[str], float | None]:
    """Racks to hold for a blocked gang, and when they are expected to hold it.

    1. Candidates: the racks with the most idle nodes (a short list, for speed).
    2. For each, walk its running jobs by expected end until enough nodes would be
       idle (the gang's share of the rack plus the spares rackwise keeps).
    3. Keep the racks that are ready soonest; the reservation lasts until the last
       of them is ready (None: some end is unknown, so no backfill into them).
    """
    for gpn, racks in fleet.groups.items():
        if job.is_small(gpn):
            return frozenset(), None  # small jobs are never starved: any node will do
        n = job.nodes_needed(gpn)
        if n == 0:
            continue
        size = max(r.size for r in racks)
        k = min_racks(n, size, job.segment_nodes)
        if not 0 < k <= len(racks):
            continue  # this shape can never hold the gang
        share = -(-n // k) if not job.segment_nodes else min(n, job.segment_nodes)
        cands = fleet.most_idle(gpn, k + 8)  # the most idle nodes first, then rack order
        ready: list[tuple[float, int, str]] = []
        for rack in cands:
            borrow = may_borrow(rack, n, job.preemptible, share)
            need = share + (0 if borrow else rack.unlent_spares())
            ready.append((_ready_at(fleet, rack.id, need, now), fleet.rack_pos[rack.id], rack.id))
        ready.sort()
        chosen = ready[:k]
        until = max(t for t, _, _ in chosen)
        return frozenset(r for _, _, r in chosen), (None if until == math.inf else until)
    return frozenset(), None


def _ready_at(fleet: Fleet, rack_id: str, need: int, now: float | None) -> float:
    rack = fleet.rack_by_id[rack_id]
    idle = rack.free_count
    if idle >= need:
        return now if now is not None else 0.0
    # A node becomes idle when the last of its jobs ends (unknown end: never).
    allocs = fleet.allocations
    node_free_at: list[float] = []
    for node in rack.nodes:
        if node.jobs and node.health == HEALTHY:
            last = -math.inf
            for jid in node.jobs:
                end = allocs[jid].expected_end
                if end is None:
                    last = math.inf
                    break
                if end > last:
                    last = end
            node_free_at.append(last)
    missing = need - idle
    if missing > len(node_free_at):
        return math.inf
    node_free_at.sort()
    return node_free_at[missing - 1]
