"""Entry points for placement: one job (:func:`place`) or a queue pass (:func:`schedule`)."""

from __future__ import annotations

import random
from collections.abc import Iterable

from placement.model import Fleet, JobRequest
from placement.plans import PlacementPlan, SchedulePlan, not_placed
from placement.policies import POLICIES, Context
from placement.policies.common import min_racks
from placement.policies.rackwise import may_span

DEFAULT_POLICY = "rackwise"


def place(
    fleet: Fleet,
    job: JobRequest,
    policy: str = DEFAULT_POLICY,
    *,
    seed: int = 0,
    rng: random.Random | None = None,
    reserved: Iterable[str] = (),
    exclude: Iterable[str] = (),
    now: float | None = None,
) -> PlacementPlan:
    """Decide where ``job`` goes under ``policy``; the fleet is not changed.

    Returns a plan with ``placed`` False and a reason when the job must wait.
    ``reserved`` racks keep their idle nodes (look-ahead); ``now`` is the clock for
    policies that weigh waiting against spanning racks; ``exclude`` racks are not
    used at all. Deterministic for a seed.
    """
    fn = POLICIES.get(policy)
    if fn is None:
        raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
    ctx = Context(rng or random.Random(seed), frozenset(reserved), now)
    best: PlacementPlan | None = None
    reasons: list[str] = []
    skip = frozenset(exclude)
    for gpn, racks in fleet.groups.items():
        if skip:
            racks = [r for r in racks if r.id not in skip]
            if not racks:
                continue
        if not job.is_small(gpn) and job.nodes_needed(gpn) == 0:
            reasons.append(f"{gpn}-GPU nodes: job needs {job.gpus_per_node} GPUs per node")
            continue
        plan = fn(fleet, job, racks, ctx)
        if not plan.placed:
            reasons.append(plan.reason if len(fleet.groups) == 1 else f"{gpn}-GPU racks: "
                           + plan.reason)
            continue
        # Mixed fleets: prefer the shape that needs the fewest racks, then fewest nodes.
        if best is None or (len(plan.racks), len(plan.nodes)) < (len(best.racks),
                                                                 len(best.nodes)):
            best = plan
    if best is None:
        return not_placed(job, policy, "; ".join(reasons) or "the fleet has no racks")
    return best


def can_ever_fit(fleet: Fleet, job: JobRequest) -> tuple[bool, str]:
    """Could the job be placed on this fleet if it were empty and healthy?"""
    for gpn, racks in fleet.groups.items():
        if job.is_small(gpn):
            return True, "fits on one node"
        n = job.nodes_needed(gpn)
        if n == 0:
            continue
        size = max(r.size for r in racks)
        seg = job.segment_nodes
        if seg and seg > size:
            continue
        total = sum(r.size for r in racks)
        if seg:
            total = sum((r.size // seg) * seg for r in racks)
        if n <= total and min_racks(n, size, seg) <= len(racks):
            return True, f"fits in {gpn}-GPU racks"
    return False, (f"needs {job.total_gpus} GPUs"
                   f"{' in segments of ' + str(job.segment_nodes) if job.segment_nodes else ''}"
                   "; more than the fleet can ever hold")


def queue_order(jobs: Iterable[JobRequest]) -> list[JobRequest]:
    """Priority first, then submit time, then the order given (stable)."""
    return sorted(jobs, key=lambda j: (-j.priority, j.submit_time or 0.0))


def schedule(
    fleet: Fleet,
    pending: Iterable[JobRequest],
    policy: str = DEFAULT_POLICY,
    *,
    now: float | None = None,
    seed: int = 0,
    rng: random.Random | None = None,
    apply: bool = False,
) -> SchedulePlan:
    """One queue pass: start every pending job that may start now, in queue order.

    1. Jobs are taken by priority, then submit time.
    2. Baselines start any job that fits (best-effort FIFO, Kueue's default; Slurm's
       main scheduler behaves so for jobs without time limits).
    3. ``rackwise`` looks ahead: the first gang that cannot start gets a reservation
       on the racks closest to holding it (most idle nodes); later jobs backfill only
       outside those racks (small jobs may still fill partly used nodes there), so a
       blocked big job is not starved by a stream of small ones.
    With ``apply`` the placements are recorded on ``fleet``; otherwise on a copy.
    """
    work = fleet if apply else fleet.copy()
    rng = rng or random.Random(seed)
    out = SchedulePlan(policy)
    reserved: frozenset[str] = frozenset()
    failed: dict[tuple[object, ...], str] = {}
    for job in queue_order(pending):
        if not any(r.free for r in work.racks) and not any(work.partial.values()):
            out.waiting[job.id] = "no free GPU in the fleet"
            continue
        key = (job.num_gpus, job.num_nodes, job.gpus_per_node, job.segment_nodes,
               job.locality, _may_span_key(policy, job, now))
        if key in failed:
            out.waiting[job.id] = failed[key]
            continue
        plan = place(work, job, policy, rng=rng, reserved=reserved, now=now)
        if plan.placed:
            work.allocate(plan.allocation(job))
            out.placements.append(plan)
            continue
        failed[key] = plan.reason
        out.waiting[job.id] = plan.reason
        if policy == "rackwise" and not reserved:
            reserved = _reserve(work, job)
            if reserved:
                failed.clear()  # the reservation changes what later jobs may use
                out.reservation = {"job_id": job.id, "racks": sorted(reserved)}
    return out


def _may_span_key(policy: str, job: JobRequest, now: float | None) -> bool:
    if policy != "rackwise":
        return False
    return may_span(job, Context(now=now))


def _reserve(fleet: Fleet, job: JobRequest) -> frozenset[str]:
    """Racks to hold for a blocked gang: those with the most idle nodes."""
    for gpn, racks in fleet.groups.items():
        if job.is_small(gpn):
            return frozenset()  # small jobs are never starved: any node will do
        n = job.nodes_needed(gpn)
        if n == 0:
            continue
        size = max(r.size for r in racks)
        k = min_racks(n, size, job.segment_nodes)
        if k > len(racks):
            continue
        best = sorted(racks, key=lambda r: (-r.free_count, fleet.rack_pos[r.id]))[:k]
        return frozenset(r.id for r in best)
    return frozenset()
