"""In-place recovery of a running job when some of its nodes fail."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from placement.model import FAILED, HEALTHY, REQUIRED, Allocation, Fleet, JobRequest
from placement.place import place
from placement.plans import PlacementPlan, RecoveryPlan
from placement.queues import degraded_for

DEFAULT_RESTART_MINUTES = 10.0


def restart_cost_gpu_hours(
    job: JobRequest,
    gpus: int,
    restart_minutes: float = DEFAULT_RESTART_MINUTES,
    *,
    now: float | None = None,
    started_at: float | None = None,
) -> float:
    """GPU-hours lost by stopping a job now: the work since its last checkpoint plus
    the restart. Exact when ``now`` and the run's ``started_at`` are known; otherwise
    the expectation, half a checkpoint interval."""
    ckpt = job.checkpoint_minutes * 60
    if now is not None and started_at is not None and ckpt > 0 and now >= started_at:
        since = (now - started_at) % ckpt
    else:
        since = ckpt / 2
    return gpus * (since / 60 + restart_minutes) / 60.0


def recover(
    fleet: Fleet,
    job_id: str,
    failed_node_ids: Iterable[str],
    *,
    policy: str = "rackwise",
    restart_minutes: float = DEFAULT_RESTART_MINUTES,
    now: float | None = None,
    preempt: bool = True,
) -> RecoveryPlan:
    """Plan the recovery of ``job_id`` after ``failed_node_ids`` failed.

    1. Swap each failed node for an idle healthy node in the same rack (a spare or any
       free node), keeping every other node where it is; never for a gang in a rack
       whose NVLink fabric is degraded (``fleet.degraded``): it goes to step 3.
    2. Else free nodes in that rack by preempting preemptible jobs of lower priority
       (a non-preemptible gang also takes back spares lent to preemptible jobs of
       any priority), cheapest first.
    3. Else move the whole job to the fewest racks that hold it (``policy`` placement).
    4. Else requeue it.
    The fleet is left as it was; apply the plan with :func:`apply_recovery`. With
    ``now`` (and ``Allocation.started_at``) victims are costed by the work they would
    really lose, so one that has just checkpointed is preferred. ``preempt=False``
    skips step 2: a precaution (a node flagged before it fails, drain-before-failure
    in ``placement/sim/precursors.py``) does not stop other jobs for a failure that
    may not come.
    """
    alloc = fleet.allocations.get(job_id)
    failed_ids = list(dict.fromkeys(failed_node_ids))
    if alloc is None:
        return RecoveryPlan(job_id, "none", f"job {job_id} holds no allocation")
    hit = [n for n in failed_ids if n in alloc.nodes]
    if not hit:
        return RecoveryPlan(job_id, "none", "none of the failed nodes belongs to the job")
    # Mark the failed nodes failed for the duration of the planning, then restore.
    saved = {n: fleet.nodes[n].health for n in failed_ids if n in fleet.nodes}
    for n in saved:
        if saved[n] != FAILED:
            fleet.set_health(n, FAILED)
    try:
        return _plan(fleet, alloc, hit, policy, restart_minutes, now, preempt)
    finally:
        for n, h in saved.items():
            if fleet.nodes[n].health != h:
                fleet.set_health(n, h)


def _plan(
    fleet: Fleet,
    alloc: Allocation,
    hit: list[str],
    policy: str,
    restart_minutes: float,
    now: float | None,
    preempt: bool = True,
) -> RecoveryPlan:
    job = alloc.job
    gpn = fleet.nodes[hit[0]].gpus
    small = job.is_small(gpn)
    steps: list[str] = []
    # A gang never swaps into a rack whose NVLink fabric is degraded: it moves.
    bad = sorted({fleet.nodes[n].rack for n in hit} & degraded_for(fleet, job))
    if bad:
        names = ", ".join(fleet.rack_by_id[r].label for r in bad)
        steps.append(f"no swap into {names}: NVLink fabric degraded")
        return _move_or_requeue(fleet, alloc, policy, steps)
    # 1. Same-rack swaps.
    swaps, short = _swaps(fleet, alloc, hit, small, frozenset())
    if not short:
        why = (
            f"swap {len(swaps)} failed node(s) for idle node(s) in the same rack; "
            f"{len(alloc.nodes) - len(hit)} other node(s) stay where they are"
        )
        steps = [f"replace {a} with {b} (same rack)" for a, b in swaps.items()]
        return RecoveryPlan(job.id, "swap", why, swaps, steps=steps)
    steps.append(f"no idle node in rack(s) {sorted(short)} to replace the failed node(s)")
    # 2. Preempt cheaper jobs in the racks that are short.
    victims = _victims(fleet, alloc, hit, short, small, restart_minutes, now) if preempt else None
    if victims is not None:
        released = [fleet.release(v) for v in victims]
        try:
            swaps, still = _swaps(fleet, alloc, hit, small, frozenset())
        finally:
            for a in released:
                fleet.allocate(a, restore=True)
        if not still:
            why = (
                f"preempt {', '.join(victims)} (preemptible, lower priority or borrowing "
                f"spares) to free node(s) in the same rack, then swap"
            )
            steps += [f"preempt {v}" for v in victims]
            steps += [f"replace {a} with {b} (same rack)" for a, b in swaps.items()]
            return RecoveryPlan(job.id, "preempt_swap", why, swaps, victims, steps=steps)
        steps.append("preempting eligible jobs would not free enough nodes")
    elif preempt:
        steps.append("no preemptible lower-priority job frees a node there")
    else:
        steps.append("preempting is not allowed here")
    return _move_or_requeue(fleet, alloc, policy, steps)


def whole_move(fleet: Fleet, alloc: Allocation, policy: str) -> PlacementPlan:
    """Where ``alloc``'s job would go, rack-local, were it stopped (its own nodes
    count as free); the fleet is left as it was. Recovery's move and a rack's
    evacuation both ask here."""
    fleet.release(alloc.job_id)
    try:
        plan = place(fleet, dataclasses.replace(alloc.job, locality=REQUIRED), policy)
        plan.job_id = alloc.job_id
    finally:
        fleet.allocate(alloc, restore=True)
    return plan


def _move_or_requeue(fleet: Fleet, alloc: Allocation, policy: str, steps: list[str]) -> RecoveryPlan:
    job = alloc.job
    # 3. Move the whole job, to the fewest racks (never a new cross-rack span).
    plan = whole_move(fleet, alloc, policy)
    if plan.placed:
        why = f"move the whole job: {plan.reason}"
        steps.append(f"checkpoint-restart {job.id} on racks {', '.join(plan.racks)}")
        return RecoveryPlan(
            job.id, "move", why, new_nodes=dict(plan.nodes), new_segments=plan.segments, steps=steps
        )
    steps.append(f"cannot move: {plan.reason}")
    # 4. Requeue.
    return RecoveryPlan(
        job.id,
        "requeue",
        "no spare, no preemptible victim and no room elsewhere: requeue the job",
        steps=steps,
    )


def _swaps(
    fleet: Fleet, alloc: Allocation, hit: list[str], small: bool, avoid: frozenset[str]
) -> tuple[dict[str, str], set[str]]:
    """Replacement node per failed node, same rack; and the racks that fall short."""
    swaps: dict[str, str] = {}
    short: set[str] = set()
    taken: set[str] = set()
    for nid in hit:
        node = fleet.nodes[nid]
        rack = fleet.rack_by_id[node.rack]
        pick = None
        if small:
            need = len(alloc.nodes[nid])
            cands = [
                n
                for n in rack.nodes
                if n.id not in alloc.nodes and n.id not in taken and n.id not in avoid and n.free_gpus >= need
            ]
            # Tightest fit keeps idle nodes whole.
            if cands:
                pick = min(cands, key=lambda n: (n.free_gpus, n.index))
        else:
            for i in rack.idle_slots():
                cand = fleet.node_at(rack.id, i)
                if cand.id not in taken and cand.id not in avoid and cand.gpus == node.gpus:
                    pick = cand
                    break
        if pick is None:
            short.add(rack.id)
        else:
            swaps[nid] = pick.id
            taken.add(pick.id)
    return swaps, short


def _victims(
    fleet: Fleet,
    alloc: Allocation,
    hit: list[str],
    short: set[str],
    small: bool,
    restart_minutes: float,
    now: float | None,
) -> list[str] | None:
    job = alloc.job
    need = {r: 0 for r in short}
    for nid in hit:
        r = fleet.nodes[nid].rack
        if r in need:
            need[r] += 1
    chosen: list[str] = []
    for rid, count in need.items():
        rack = fleet.rack_by_id[rid]
        cands: dict[str, float] = {}
        for node in rack.nodes:
            if node.health != HEALTHY:
                continue
            for vid in node.jobs:
                if vid == job.id or vid in chosen or vid in cands:
                    continue
                v = fleet.allocations[vid]
                # Spares lent out come back to a non-preemptible gang: it may preempt
                # any preemptible job in its rack, not only lower-priority ones.
                borrower = not small and not job.preemptible
                if v.job.preemptible and (v.job.priority < job.priority or borrower):
                    cands[vid] = restart_cost_gpu_hours(
                        v.job, v.gpus, restart_minutes, now=now, started_at=v.started_at
                    )
        # Cheapest first, until enough nodes of this rack would be idle.
        freed: list[Allocation] = []
        try:
            for vid in sorted(cands, key=lambda v: (cands[v], v)):
                if _idle_in(fleet, rack.id, alloc, small) >= count:
                    break
                freed.append(fleet.release(vid))
                chosen.append(vid)
            ok = _idle_in(fleet, rack.id, alloc, small) >= count
        finally:
            for a in freed:
                fleet.allocate(a, restore=True)
        if not ok:
            return None
    return chosen or None


def _idle_in(fleet: Fleet, rack_id: str, alloc: Allocation, small: bool) -> int:
    rack = fleet.rack_by_id[rack_id]
    if small:
        g = alloc.job.num_gpus
        return sum(1 for n in rack.nodes if n.id not in alloc.nodes and n.free_gpus >= g)
    return len(rack.free)


def apply_recovery(fleet: Fleet, plan: RecoveryPlan) -> Allocation | None:
    """Apply a recovery plan to the fleet; returns the job's new allocation (None if
    requeued). Failed nodes must already be marked failed by the caller."""
    if plan.action == "none":
        return fleet.allocations.get(plan.job_id)
    old = fleet.release(plan.job_id)
    for vid in plan.preempted:
        if vid in fleet.allocations:
            fleet.release(vid)
    if plan.action in ("swap", "preempt_swap"):
        nodes: dict[str, tuple[int, ...]] = {}
        for nid, gpus in old.nodes.items():
            new = plan.swaps.get(nid, nid)
            if new != nid and old.job.is_small(fleet.nodes[new].gpus):
                gpus = fleet.nodes[new].free_indices(len(gpus))
            nodes[new] = gpus
        segments = [[plan.swaps.get(n, n) for n in seg] for seg in old.segments]
        alloc = Allocation(old.job, nodes, segments)
    elif plan.action == "move":
        alloc = Allocation(old.job, dict(plan.new_nodes), [list(s) for s in plan.new_segments])
    else:
        return None
    fleet.allocate(alloc)
    return alloc
