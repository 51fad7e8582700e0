"""Preemption at placement time: the victims whose stop lets a waiting job start.

Used for a tenant under its nominal quota taking back what others borrowed
(:mod:`placement.quota`) and for a higher priority inside a tenant. Rack-aware:
the victims are chosen so that the waiting gang gets one NVLink domain (or
whole segments), not GPUs scattered over racks (the gap Kueue #10815 and
KAI #1591 describe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from placement.model import HEALTHY, Allocation, Fleet, JobRequest
from placement.place import place
from placement.plans import PlacementPlan
from placement.recover import DEFAULT_RESTART_MINUTES, restart_cost_gpu_hours


@dataclass
class ReclaimPlan:
    job_id: str
    placed: bool
    reason: str
    victims: list[str] = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)
    placement: PlacementPlan | None = None

    @property
    def cost_gpu_hours(self) -> float:
        return sum(self.costs.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "placed": self.placed,
            "reason": self.reason,
            "victims": list(self.victims),
            "costs": dict(self.costs),
            "cost_gpu_hours": round(self.cost_gpu_hours, 4),
            "placement": self.placement.to_dict() if self.placement else None,
        }


def reclaim(
    fleet: Fleet,
    job: JobRequest,
    may_preempt: Callable[[JobRequest], bool],
    limits: dict[str, int],
    *,
    need_gpus: int = 0,
    policy: str = "rackwise",
    now: float | None = None,
    restart_minutes: float = DEFAULT_RESTART_MINUTES,
) -> ReclaimPlan:
    """The fewest GPU-hours of running work to stop so that ``job`` starts now.

    ``may_preempt(victim)`` says which running jobs may be stopped at all;
    ``limits`` caps, per tenant, the GPUs taken from it (a reclaim takes from a
    tenant only what it holds beyond its nominal quota, never a job that would
    take it below: a tenant without an entry is not limited). ``need_gpus``: at least this many GPUs must come
    from limited tenants (the quota pool's overdraw), even if fewer would make
    room.

    1. Candidates: the jobs ``may_preempt`` allows, preemptible ones first,
       then by the work each would lose (since its last checkpoint, and the
       restart).
    2. For each rack that could hold the job by itself, cheapest bound first
       (a lower bound on the cost of making room there; the search ends at a
       rack whose bound exceeds the best set found): stop candidates with
       GPUs in that rack, in that order, until the job places inside the rack
       (and ``need_gpus`` is met); then give back, dearest first, every victim
       the placement does not need. So no more is stopped than needed, and the
       room made is one NVLink domain. When the limits stop that walk short
       (the cheapest victims spent a tenant's limit on nodes that stay busy),
       it is walked again node by node (:func:`_node_steps`): all the jobs of
       one node at a time, a node that would pass a limit skipped whole.
    3. If no single rack works (a gang bigger than a rack, or one whose
       segments must span racks): the same over the whole fleet.
    4. The cheapest set wins (then the fewest victims, then the rack's id);
       racks reserved for the job's tenant are searched first, and win when
       any of them works.
    The fleet is left as it was.
    """
    costs: dict[str, float] = {}
    for vid, alloc in fleet.allocations.items():
        if vid == job.id or not may_preempt(alloc.job):
            continue
        if any(fleet.nodes[n].health != HEALTHY for n in alloc.nodes):
            continue  # in recovery's hands
        costs[vid] = restart_cost_gpu_hours(
            alloc.job, alloc.gpus, restart_minutes, now=now, started_at=alloc.started_at
        )
    order = sorted(costs, key=lambda v: (not fleet.allocations[v].job.preemptible, costs[v], v))

    by_rack: dict[str, list[str]] = {}
    for vid in order:
        for rid in {fleet.nodes[n].rack for n in fleet.allocations[vid].nodes}:
            by_rack.setdefault(rid, []).append(vid)
    # Racks in the order of a lower bound on what making room there costs; the
    # search stops at the first rack whose bound exceeds the best set found.
    bounded = []
    for rack in fleet.racks:
        here = by_rack.get(rack.id, [])
        bound = _least_cost(fleet, job, rack, here, costs)
        if bound is not None:
            bounded.append((bound, rack.id, here))
    bounded.sort(key=lambda b: (b[0], b[1]))
    everyone = frozenset(fleet.rack_by_id)
    own = {r for r, t in fleet.reservations.items() if t == job.tenant}
    best: tuple[tuple[float, int, str], list[str], PlacementPlan] | None = None
    # The job's tenant's reserved racks first: a reclaim takes back its own domains.
    for tier in ([b for b in bounded if b[1] in own], [b for b in bounded if b[1] not in own]):
        for bound, rid, here in tier:
            if best is not None and bound > best[0][0] + 1e-6:
                break
            found = _victims_by_cost_or_node(
                fleet, job, here, costs, limits, need_gpus, policy, now, everyone - {rid}, rid
            )
            if found is not None:
                victims, plan = found
                key = (round(sum(costs[v] for v in victims), 6), len(victims), rid)
                if best is None or key < best[0]:
                    best = (key, victims, plan)
        if best is not None:
            break
    if best is None:
        found = _victims_by_cost_or_node(
            fleet, job, order, costs, limits, need_gpus, policy, now, frozenset(), None
        )
        if found is not None:
            victims, plan = found
            best = ((sum(costs[v] for v in victims), len(victims), ""), victims, plan)
    if best is None:
        within = " within the GPUs each tenant may lose" if limits else ""
        return ReclaimPlan(
            job.id, False, f"stopping every job it may preempt{within} would still not make room for it"
        )
    _, victims, plan = best
    where = ", ".join(plan.racks)
    return ReclaimPlan(
        job.id,
        True,
        f"stops {len(victims)} job(s) ({sum(costs[v] for v in victims):.1f} GPU-hours lost) "
        f"to start it in {where}",
        victims=victims,
        costs={v: round(costs[v], 4) for v in victims},
        placement=plan,
    )


def _least_cost(
    fleet: Fleet, job: JobRequest, rack, here: list[str], costs: dict[str, float]
) -> float | None:
    """A lower bound on the GPU-hours lost to make room for ``job`` in ``rack``
    alone from the candidates ``here`` (a fractional knapsack over their GPUs in
    the rack), or None when the job cannot sit in the rack even if all of them
    stopped."""
    gpn = rack.gpus_per_node
    if job.is_small(gpn):
        want = job.num_gpus
    else:
        nodes = job.nodes_needed(gpn)
        if not 0 < nodes <= rack.healthy:
            return None
        want = nodes * gpn
    deficit = want - rack.free_gpus()
    if deficit <= 0:
        return 0.0
    offers = []
    for vid in here:
        alloc = fleet.allocations[vid]
        inside = sum(len(g) for n, g in alloc.nodes.items() if fleet.nodes[n].rack == rack.id)
        offers.append((costs[vid] / inside, inside))
    offers.sort()
    bound = 0.0
    for per_gpu, gpus in offers:
        take = min(gpus, deficit)
        bound += per_gpu * take
        deficit -= take
        if deficit <= 0:
            return bound
    return None


def _victims_by_cost_or_node(
    fleet: Fleet,
    job: JobRequest,
    order: list[str],
    costs: dict[str, float],
    limits: dict[str, int],
    need_gpus: int,
    policy: str,
    now: float | None,
    exclude: frozenset[str],
    rack: str | None,
) -> tuple[list[str], PlacementPlan] | None:
    """Step 2 (or 3, ``rack`` None) of :func:`reclaim`: the victims in cost
    order, else, when limits apply, node by node (:func:`_node_steps`)."""
    steps = [[vid] for vid in order]
    found = _victims(fleet, job, order, steps, limits, need_gpus, policy, now, exclude)
    if found is not None:
        return found
    if all(g <= limits.get(t, g) for t, g in _gpus_by_tenant(fleet, order).items()):
        return None  # no limit skipped a victim: stopping them all made no room
    for by_limited in (False, True):
        steps = _node_steps(fleet, order, costs, limits, rack, by_limited)
        found = _victims(fleet, job, order, steps, limits, need_gpus, policy, now, exclude)
        if found is not None:
            return found
    return None


def _gpus_by_tenant(fleet: Fleet, vids: list[str]) -> dict[str, int]:
    """The GPUs these running jobs hold, by tenant."""
    out: dict[str, int] = {}
    for vid in vids:
        alloc = fleet.allocations[vid]
        out[alloc.job.tenant] = out.get(alloc.job.tenant, 0) + alloc.gpus
    return out


def _node_steps(
    fleet: Fleet,
    order: list[str],
    costs: dict[str, float],
    limits: dict[str, int],
    rack: str | None,
    by_limited: bool,
) -> list[list[str]]:
    """The candidates grouped by node (in ``rack``, or anywhere), one step per node
    whose jobs are all candidates: the cheapest node to free first, or with
    ``by_limited`` the node taking the fewest GPUs from limited tenants first (a
    tight limit then reaches more nodes)."""
    candidates = set(order)
    on: dict[str, list[str]] = {}
    for vid in order:
        for nid in fleet.allocations[vid].nodes:
            if rack is None or fleet.nodes[nid].rack == rack:
                on.setdefault(nid, []).append(vid)

    def key(nid: str) -> tuple[float, float, str]:
        cost = sum(costs[v] for v in on[nid])
        limited = sum(fleet.allocations[v].gpus for v in on[nid] if fleet.allocations[v].job.tenant in limits)
        return (limited, cost, nid) if by_limited else (cost, limited, nid)

    freeable = [nid for nid in on if candidates.issuperset(fleet.nodes[nid].jobs)]
    return [on[nid] for nid in sorted(freeable, key=key)]


def _victims(
    fleet: Fleet,
    job: JobRequest,
    order: list[str],
    steps: list[list[str]],
    limits: dict[str, int],
    need_gpus: int,
    policy: str,
    now: float | None,
    exclude: frozenset[str],
) -> tuple[list[str], PlacementPlan] | None:
    """Stop ``steps`` in turn (each step's jobs together, or none of them when
    that would pass a tenant's limit) until the job places, on a trial of the
    fleet; then give back what is not needed. Victims come back in ``order``."""
    with fleet.trial():
        taken: dict[str, int] = {}
        stopped: dict[str, Allocation] = {}

        def enough() -> PlacementPlan | None:
            if sum(taken.get(t, 0) for t in limits) < need_gpus:
                return None
            plan = place(fleet, job, policy, exclude=exclude, now=now)
            return plan if plan.placed else None

        def count(alloc: Allocation, sign: int) -> None:
            taken[alloc.job.tenant] = taken.get(alloc.job.tenant, 0) + sign * alloc.gpus

        plan = enough()
        for step in steps:
            if plan is not None:
                break
            step = [vid for vid in step if vid not in stopped]
            more = _gpus_by_tenant(fleet, step)
            if any(t in limits and taken.get(t, 0) + g > limits[t] for t, g in more.items()):
                continue  # it would take a tenant below its nominal quota
            for vid in step:
                stopped[vid] = fleet.release(vid)
                count(stopped[vid], +1)
            if step:
                plan = enough()
        if plan is None:
            return None
        # Give back, dearest first, every victim the job does not need.
        pos = {vid: i for i, vid in enumerate(order)}
        for vid in sorted(stopped, key=pos.__getitem__, reverse=True):
            alloc = stopped.pop(vid)
            fleet.allocate(alloc, restore=True)
            count(alloc, -1)
            kept = enough()
            if kept is not None:
                plan = kept
                continue
            fleet.release(vid)
            stopped[vid] = alloc
            count(alloc, +1)
        return sorted(stopped, key=pos.__getitem__), plan


def reclaim_for_quota(
    fleet: Fleet,
    job: JobRequest,
    may_preempt: Callable[[JobRequest], bool],
    budgets: dict[str, int],
    held: dict[str, int],
    nominal: Callable[[str], int],
    *,
    widen: bool = True,
    **kw: Any,
) -> ReclaimPlan:
    """:func:`reclaim` for a job taking back what other tenants hold above their
    line (``budgets``: tenant -> GPUs it may lose).

    1. Within the budgets: no tenant goes below its line.
    2. Else, with ``widen`` (a job within its tenant's nominal quota, the budgets
       being what borrowers hold above nominal), a borrower may lose a job that
       straddles its nominal line (Kueue's ``reclaimWithinCohort``: a queue is a
       candidate while it borrows), each victim only while its tenant is still
       above nominal (``held`` GPUs), in the order they stop. Without this, a
       borrower holding one big job could never be reclaimed from. A fair-share
       reclaim (budgets above both nominal quota and fair share) does not widen."""
    plan = reclaim(fleet, job, may_preempt, budgets, **kw)
    if plan.placed or not budgets or not widen:
        return plan
    wider = reclaim(fleet, job, may_preempt, {t: held.get(t, 0) for t in budgets}, **kw)
    if not wider.placed:
        return plan
    left = dict(held)
    for vid in wider.victims:
        victim = fleet.allocations[vid].job.tenant
        if victim in budgets:
            if left.get(victim, 0) <= nominal(victim):
                return plan
            left[victim] -= fleet.allocations[vid].gpus
    return wider
