"""Defragmentation planning: the cheapest moves of preemptible jobs that make room."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from placement.fragmentation import fragmentation
from placement.model import DRAINING, HEALTHY, REQUIRED, Allocation, Fleet, JobRequest, Node, Rack
from placement.place import place, queue_order
from placement.plans import DefragPlan, Move
from placement.policies.common import min_racks
from placement.policies.rackwise import idle_holds, may_borrow
from placement.recover import DEFAULT_RESTART_MINUTES, restart_cost_gpu_hours

CANDIDATE_RACKS = 8  # racks tried per goal, fewest nodes to clear first (speed bound)
CANDIDATE_NODES = 16  # nodes tried per single-node goal, fewest moves first (speed bound)


@dataclass(frozen=True)
class FreeRacks:
    """Target: at least ``count`` racks with every healthy node idle."""

    count: int


@dataclass(frozen=True)
class RoomFor:
    """Target: room for a rack-local job of ``nodes`` whole nodes (``gpus_per_node``)."""

    nodes: int
    gpus_per_node: int = 4


Target = FreeRacks | RoomFor


@dataclass(frozen=True)
class _Step:
    """A planned move and the allocation it replaces (to apply it again or undo it)."""

    move: Move
    old: Allocation


def _whole_racks(fleet: Fleet) -> int:
    # Racks with an idle node and every healthy node idle (free_count == healthy),
    # found without counting each rack's healthy nodes: the first busy one decides.
    return sum(
        1 for r in fleet.racks if r.free and all(n.index in r.free or n.health != HEALTHY for n in r.nodes)
    )


def _local(job: JobRequest) -> JobRequest:
    return dataclasses.replace(job, locality=REQUIRED)


def defragment(
    fleet: Fleet,
    pending_jobs: Iterable[JobRequest] = (),
    target: Target | None = None,
    *,
    budget_gpu_hours: float = math.inf,
    max_moves: int | None = None,
    restart_minutes: float = DEFAULT_RESTART_MINUTES,
    shapes: Mapping[int, float] | Sequence[JobRequest] | None = None,
    now: float | None = None,
    figures: bool = True,
) -> DefragPlan:
    """Plan moves of preemptible jobs that make ``target`` (or the pending jobs) fit.

    1. Goals: the target, or each pending job that cannot be placed rack-locally now.
       A job that fits one node (GPU-level fragmentation: small jobs scattered so that
       no node has room) is served by freeing GPUs on one node: the node whose room
       needs the fewest moves of small preemptible jobs (then the cheapest), each
       re-placed by rackwise on another node.
    2. For a goal, each candidate rack (fewest nodes to clear first) is tried: its
       occupants are moved out one by one, cheapest first (cost: GPU-hours lost to the
       checkpoint interval and the restart), each re-placed by rackwise elsewhere.
       A rack with a non-preemptible occupant, or an occupant with nowhere to go, is
       skipped. The cheapest rack wins.
    3. Goals are served in queue order while the budget (GPU-hours, moves) lasts.
    4. The plan reports cost, the jobs it makes placeable, and fragmentation and whole
       free racks before and after. The fleet itself is not changed.
    With ``now`` (and ``Allocation.started_at``) a move costs the work really lost
    since the job's last checkpoint, not the expected half interval. ``figures=False``
    leaves out the fragmentation and free-rack figures (0 in the plan), for a caller
    that only applies the moves (the simulator).
    """
    # Planned on the fleet itself: the trial undoes every move on the way out.
    with fleet.trial():
        return _plan(
            fleet,
            queue_order(pending_jobs),
            target,
            shapes,
            budget_gpu_hours,
            max_moves,
            restart_minutes,
            now,
            figures,
        )


def _plan(
    fleet: Fleet,
    pending: list[JobRequest],
    target: Target | None,
    shapes: Mapping[int, float] | Sequence[JobRequest] | None,
    budget_gpu_hours: float,
    max_moves: int | None,
    restart_minutes: float,
    now: float | None,
    figures: bool,
) -> DefragPlan:
    """:func:`defragment`'s steps, on ``fleet`` under a trial: the figures of the
    fleet as it was are read before the first move."""
    work = fleet  # what the moves change (undone when the trial ends)
    shape_src: Mapping[int, float] | Sequence[JobRequest] | None = shapes or (pending or None)
    frag_before = fragmentation(fleet, shape_src).fraction if figures else 0.0
    racks_before = _whole_racks(fleet) if figures or isinstance(target, FreeRacks) else 0
    placeable_before = {j.id for j in pending if place(work, _local(j)).placed}
    move_limit: float = math.inf if max_moves is None else max_moves
    moves: list[Move] = []
    cost = 0.0
    reasons: list[str] = []
    targeted: set[str] = set()

    # 1. Goals as (label, nodes to free in one rack, gpus_per_node) lists; a goal of
    #    GPUs on one node has the single segment (-GPUs, gpus_per_node), a whole free
    #    rack (-1, 0).
    goals: list[tuple[str, list[tuple[int, int]], bool]] = []  # (label, segs, borrow)
    # Goals are sized by the target, which comes from a user: never more of them
    # than the fleet has racks (one rack each), whatever the count asked for.
    unreachable = ""
    if isinstance(target, FreeRacks):
        missing = max(0, target.count - racks_before)
        clearable = len(fleet.racks) - racks_before
        if missing > clearable:
            unreachable = f"the fleet has {len(fleet.racks)} racks, {racks_before} already whole"
        goals = [(f"free rack {i + 1}", [(-1, 0)], False) for i in range(min(missing, clearable))]
        label = f"free {target.count} whole racks"
    elif isinstance(target, RoomFor):
        of_size = sum(r.size for r in fleet.groups.get(target.gpus_per_node, []))
        if target.nodes > of_size:
            unreachable = f"the fleet has {of_size} nodes of {target.gpus_per_node} GPUs"
        else:
            goals = [
                (
                    f"room for {target.nodes} nodes",
                    _segments(fleet, target.nodes, target.gpus_per_node),
                    False,
                )
            ]
        label = f"room for a job of {target.nodes} nodes"
    else:
        label = "room for the pending jobs"
        for job in pending:
            if job.id in placeable_before:
                continue
            for gpn in fleet.groups:
                if job.is_small(gpn):
                    goals.append((f"job {job.id}", [(-job.num_gpus, gpn)], job.preemptible))
                    break
                if job.nodes_needed(gpn):
                    goals.append(
                        (
                            f"job {job.id}",
                            _segments(fleet, job.nodes_needed(gpn), gpn, job.segment_nodes),
                            job.preemptible,
                        )
                    )
                    break
    if unreachable and not goals:
        return DefragPlan(
            label,
            False,
            f"cannot be met: {unreachable}",
            fragmentation_before=frag_before,
            fragmentation_after=frag_before,
            free_racks_before=racks_before,
            free_racks_after=racks_before,
            jobs_made_placeable=[],
        )
    if not goals:
        reason = (
            "nothing to do: the target is already met"
            if target
            else ("nothing to do: every pending job can already be placed rack-locally")
        )
        return DefragPlan(
            label,
            True,
            reason,
            fragmentation_before=frag_before,
            fragmentation_after=frag_before,
            free_racks_before=racks_before,
            free_racks_after=racks_before,
            jobs_made_placeable=[],
        )
    met = 0
    failed_goals: set[tuple[object, ...]] = set()  # an identical goal failed already
    held: list[Node] = []  # nodes given room for a small job: drained until the end
    node_cache: dict[tuple[str, int], tuple[object, _NodeMoves]] = {}
    for name, segs, borrow in goals:
        sig = (tuple(segs), borrow)
        if sig in failed_goals:
            reasons.append(f"{name}: same shape as a goal that could not be met")
            continue
        if segs[0][0] < 0 < segs[0][1]:  # GPUs on one node (a whole rack is (-1, 0))
            gpus, gpn = -segs[0][0], segs[0][1]
            clock = (restart_minutes, now)
            room = _best_node(
                work,
                gpus,
                gpn,
                targeted,
                clock,
                (budget_gpu_hours - cost, move_limit - len(moves)),
                node_cache,
            )
            if isinstance(room, str):
                failed_goals.add(sig)
                reasons.append(f"{name}: {room}")
                continue
            node, node_moves, node_cost = room
            work.set_health(node.id, DRAINING)  # hold the room for this job
            held.append(node)
            moves += [st.move for st in node_moves]
            cost += node_cost
            met += 1
            reasons.append(
                f"{name}: {len(node_moves)} move(s) free {gpus} GPUs on {node.label}, {node_cost:.2f} GPU-h"
            )
            continue
        goal_moves: list[_Step] = []
        goal_racks: list[str] = []
        goal_cost = 0.0
        ok = True
        for nodes, gpn in segs:
            best = _best_rack(work, nodes, gpn, targeted, (restart_minutes, now), borrow)
            if best is None:
                ok = False
                reasons.append(f"{name}: no rack can be cleared by moving preemptible jobs")
                break
            rack, rack_moves, rack_cost = best
            if (
                cost + goal_cost + rack_cost > budget_gpu_hours
                or len(moves) + len(goal_moves) + len(rack_moves) > move_limit
            ):
                ok = False
                reasons.append(f"{name}: would exceed the budget")
                break
            _apply(work, rack_moves)
            targeted.add(rack.id)
            goal_racks.append(rack.id)
            goal_moves += rack_moves
            goal_cost += rack_cost
        if ok:
            moves += [st.move for st in goal_moves]
            cost += goal_cost
            met += 1
            reasons.append(f"{name}: {len(goal_moves)} move(s), {goal_cost:.2f} GPU-h")
        else:
            failed_goals.add(sig)
            _undo(work, goal_moves)
            targeted.difference_update(goal_racks)
            if target is not None:
                break
    for node in held:
        work.set_health(node.id, HEALTHY)
    made = [j.id for j in pending if j.id not in placeable_before and place(work, _local(j)).placed]
    # Pending mode: success is every blocked job placeable (one goal's moves may serve
    # another); a target must have met each of its goals.
    blocked = [j for j in pending if j.id not in placeable_before]
    feasible = not unreachable and (met == len(goals) or (target is None and len(made) == len(blocked)))
    if unreachable:
        reasons.append(f"cannot be met in full: {unreachable}")
    moves = _merged(moves)
    cost = sum(m.cost_gpu_hours for m in moves)
    return DefragPlan(
        target=label,
        feasible=feasible,
        reason=("; ".join(reasons)),
        moves=moves,
        cost_gpu_hours=cost,
        jobs_made_placeable=made,
        fragmentation_before=frag_before,
        fragmentation_after=fragmentation(work, shape_src).fraction if figures else 0.0,
        free_racks_before=racks_before,
        free_racks_after=_whole_racks(work) if figures else 0,
    )


def _merged(moves: list[Move]) -> list[Move]:
    """One move per job. A job moved out of one rack can land in a rack a later goal
    clears, and be moved again: it is stopped once instead, from where it runs to
    where it ends, at its first move's place in the plan and its first move's cost
    (one checkpoint, one restart). The nodes it ends on were free at its first
    move: only a rack being cleared loses jobs, and a move never lands in a rack
    cleared earlier."""
    first: dict[str, int] = {}
    out: list[Move] = []
    for m in moves:
        if m.job_id not in first:
            first[m.job_id] = len(out)
            out.append(m)
            continue
        i = first[m.job_id]
        out[i] = dataclasses.replace(
            out[i], to_nodes=m.to_nodes, to_segments=m.to_segments, reason=f"{out[i].reason}; then {m.reason}"
        )
    return out


def _segments(fleet: Fleet, nodes: int, gpn: int, seg: int | None = None) -> list[tuple[int, int]]:
    """Per-rack node counts a gang needs: one rack, or equal segments over the fewest."""
    racks = fleet.groups.get(gpn, [])
    size = max((r.size for r in racks), default=0)
    k = min_racks(nodes, size, seg) if size else 1
    if seg:
        return [(seg, gpn)] * (nodes // seg) + ([(nodes % seg, gpn)] if nodes % seg else [])
    base, extra = divmod(nodes, k)
    return [(base + 1, gpn)] * extra + [(base, gpn)] * (k - extra)


def _need(rack: Rack, nodes: int, borrow: bool = False) -> int:
    """Nodes still to free so that rackwise would give ``nodes`` (-1: the whole rack).

    ``borrow``: the gang is preemptible and may use the rack's spares; targets are
    planned as non-preemptible gangs, which keep them."""
    if nodes < 0:
        return rack.healthy - rack.free_count
    have = rack.free_count if may_borrow(rack, nodes, borrow) else rack.slice_offer()
    return max(0, nodes - have)


def _best_rack(
    work: Fleet, nodes: int, gpn: int, targeted: set[str], clock: tuple[float, float | None], borrow: bool
) -> tuple[Rack, list[_Step], float] | None:
    pool = work.groups.get(gpn, []) if gpn else work.racks
    racks = [r for r in pool if r.id not in targeted]
    racks.sort(key=lambda r: (_need(r, nodes, borrow), work.rack_pos[r.id]))
    best: tuple[Rack, list[_Step], float] | None = None
    # The first racks with the nodes and whose preemptible occupants could free
    # enough, counted only as far as needed (each trial below is undone before the
    # next rack is counted).
    for rack in itertools.islice(
        (
            r
            for r in racks
            if (r.healthy >= nodes if nodes >= 0 else r.free_count < r.healthy)
            and _freeable(work, r) >= _need(r, nodes, borrow)
        ),
        CANDIDATE_RACKS,
    ):
        if _need(rack, nodes, borrow) == 0:
            return rack, [], 0.0
        if any(not work.allocations[j].job.preemptible for n in rack.nodes for j in n.jobs):
            if nodes < 0:
                continue
        trial = _clear(work, rack, nodes, targeted, clock, borrow)
        _undo(work, trial[0] if trial else [])
        if trial is None:
            continue
        moves, cost = trial
        if best is None or (cost, len(moves)) < (best[2], len(best[1])):
            best = (rack, moves, cost)
    return best


def _freeable(work: Fleet, rack: Rack) -> int:
    """Busy healthy nodes of the rack whose jobs are all preemptible (an upper bound on
    what moves can free there)."""
    return sum(
        1
        for n in rack.nodes
        if n.jobs and n.health == "healthy" and all(work.allocations[j].job.preemptible for j in n.jobs)
    )


def _clear(
    work: Fleet, rack: Rack, nodes: int, targeted: set[str], clock: tuple[float, float | None], borrow: bool
) -> tuple[list[_Step], float] | None:
    """Move occupants out of ``rack`` (cheapest per node freed first) until it has room.

    The moves are applied to ``work``; on failure they are undone and None returned.
    ``clock`` is (restart minutes, now).
    """
    restart_minutes, now = clock
    occupants: dict[str, float] = {}
    for node in rack.nodes:
        for jid in node.jobs:
            if jid not in occupants:
                a = work.allocations[jid]
                here = sum(1 for n in a.nodes if work.nodes[n].rack == rack.id)
                occupants[jid] = (
                    restart_cost_gpu_hours(a.job, a.gpus, restart_minutes, now=now, started_at=a.started_at)
                    / here
                )
    moves: list[_Step] = []
    cost = 0.0
    avoid = targeted | {rack.id}
    for jid in sorted(occupants, key=lambda j: (occupants[j], j)):
        if _need(rack, nodes, borrow) == 0:
            break
        alloc = work.allocations[jid]
        if not alloc.job.preemptible:
            continue
        # The moved job's locality never gets worse: a rack-local job stays rack-local
        # (fewest racks), a job already spread over k racks lands on at most k.
        spread = len(work.racks_of(alloc))
        if not _room_elsewhere(work, alloc, avoid, spread):
            _undo(work, moves)
            return None
        work.release(jid)
        plan = place(work, _local(alloc.job) if spread == 1 else alloc.job, exclude=avoid)
        # Nothing may land in a rack being cleared (not even on a partly used node).
        if not plan.placed or any(r in avoid for r in plan.racks) or len(plan.racks) > spread:
            work.allocate(alloc, restore=True)
            _undo(work, moves)
            return None
        new = plan.allocation(alloc.job)
        work.allocate(new)
        c = restart_cost_gpu_hours(
            alloc.job, alloc.gpus, restart_minutes, now=now, started_at=alloc.started_at
        )
        moves.append(
            _Step(
                Move(
                    jid,
                    list(alloc.nodes),
                    dict(new.nodes),
                    new.segments,
                    c,
                    f"move out of {rack.label}: {plan.reason}",
                ),
                alloc,
            )
        )
        cost += c
    if _need(rack, nodes, borrow) > 0:
        _undo(work, moves)
        return None
    return moves, cost


def _room_elsewhere(work: Fleet, alloc: Allocation, avoid: set[str], k: int) -> bool:
    """Could the gang of ``alloc``, once released, land on at most ``k`` racks outside
    ``avoid``? False only when it certainly cannot: even the ``k`` such racks with the
    most idle nodes (its own nodes counted idle) do not hold it in whole segments. A
    job that fits one node: True. Read from the idle-count index, so that a rack whose
    cheapest occupant has nowhere to go is given up without releasing and placing it."""
    job = alloc.job
    seg = job.segment_nodes
    freed: dict[str, int] = {}
    for nid in alloc.nodes:
        rid = work.nodes[nid].rack
        if rid not in avoid:
            freed[rid] = freed.get(rid, 0) + 1
    for gpn, index in work.by_free.items():
        if job.is_small(gpn):
            return True
        n = job.nodes_needed(gpn)
        if not n:
            continue
        group = work.groups[gpn]
        # The racks that hold the job, its nodes counted idle, and the k most idle of
        # the others that are not avoided.
        idle = [
            c + work.rack_by_id[rid].free_count
            for rid, c in freed.items()
            if work.rack_by_id[rid].gpus_per_node == gpn
        ]
        others = 0
        for f, p in reversed(index):
            if others == k:
                break
            rid = group[p].id
            if rid not in avoid and rid not in freed:
                idle.append(f)
                others += 1
        if idle_holds(heapq.nlargest(k, idle), n, seg):
            return True
    return False


def _apply(work: Fleet, steps: list[_Step]) -> None:
    for st in steps:
        m = st.move
        if work.allocations.get(m.job_id) is st.old:
            work.release(m.job_id)
            work.allocate(Allocation(st.old.job, dict(m.to_nodes), m.to_segments))


def _undo(work: Fleet, steps: list[_Step]) -> None:
    for st in reversed(steps):
        jid = st.move.job_id
        if jid in work.allocations and work.allocations[jid] is not st.old:
            work.release(jid)
            work.allocate(st.old, restore=True)


_NodeMoves = tuple[int, float, list[str]] | None


def _node_moves(
    work: Fleet,
    node: Node,
    need: int,
    restart_minutes: float,
    now: float | None,
    cache: dict[tuple[str, int], tuple[object, _NodeMoves]],
) -> _NodeMoves:
    """The fewest small preemptible jobs to move off ``node`` to free ``need`` more GPUs
    (then the cheapest such set): (moves, GPU-hours, job ids), or None if impossible.
    ``cache`` keeps answers per (node, need) while the node's jobs stay the same."""
    state = (node.used, tuple(node.jobs))
    hit = cache.get((node.id, need))
    if hit is not None and hit[0] == state:
        return hit[1]
    movable: list[tuple[int, float, str]] = []
    for jid, mask in node.jobs.items():
        a = work.allocations[jid]
        if len(a.nodes) == 1 and a.job.preemptible and a.job.is_small(node.gpus):
            movable.append((mask.bit_count(), 0.0, jid))
    sizes = sorted((g for g, _, _ in movable), reverse=True)
    if sum(sizes) < need:
        cache[(node.id, need)] = (state, None)
        return None
    allocs = work.allocations
    movable = [
        (
            g,
            restart_cost_gpu_hours(
                allocs[j].job, allocs[j].gpus, restart_minutes, now=now, started_at=allocs[j].started_at
            ),
            j,
        )
        for g, _, j in movable
    ]
    k = next(i for i in range(1, len(sizes) + 1) if sum(sizes[:i]) >= need)
    best: tuple[float, list[str]] | None = None
    for combo in itertools.combinations(sorted(movable, key=lambda m: m[2]), k):
        if sum(g for g, _, _ in combo) >= need:
            c = sum(c for _, c, _ in combo)
            if best is None or c < best[0]:
                best = (c, [j for _, _, j in combo])
    assert best is not None
    cache[(node.id, need)] = (state, (k, best[0], best[1]))
    return k, best[0], best[1]


def _best_node(
    work: Fleet,
    gpus: int,
    gpn: int,
    targeted: set[str],
    clock: tuple[float, float | None],
    budget: tuple[float, float],
    cache: dict[tuple[str, int], tuple[object, _NodeMoves]],
) -> tuple[Node, list[_Step], float] | str:
    """Room for a job of ``gpus`` GPUs on one node of ``gpn`` GPUs, by moving the fewest
    small preemptible jobs off the node (then the cheapest). The moves are applied to
    ``work``. Returns (node, moves, cost), or why it cannot be done."""
    restart_minutes, now = clock
    racks = [r for r in work.groups.get(gpn, []) if r.id not in targeted]

    def too_few() -> str | None:
        free = sum(n.free_gpus for r in racks for n in r.nodes)
        return f"only {free} GPUs are free on {gpn}-GPU nodes, {gpus} needed" if (free < gpus) else None

    cands: list[tuple[int, float, int, int, Node, list[str]]] = []
    for rack in racks:
        for node in rack.nodes:
            if node.health != HEALTHY or node.gpus < gpus:
                continue
            f = node.free_gpus
            if f >= gpus:  # room already (the job may be held back by a reservation)
                return node, [], 0.0
            found = _node_moves(work, node, gpus - f, restart_minutes, now, cache)
            if found is not None:
                k, c, jids = found
                cands.append((k, c, work.rack_pos[rack.id], node.index, node, jids))
    if not cands:
        return too_few() or (f"no node can be given {gpus} free GPUs by moving small preemptible jobs")
    money, count = budget
    over = False
    for k, c, _, _, node, jids in heapq.nsmallest(CANDIDATE_NODES, cands, key=lambda x: x[:4]):
        if c > money or k > count:
            over = True
            continue
        steps = _clear_node(work, node, jids, targeted, clock)
        if steps is not None:
            return node, steps, sum(st.move.cost_gpu_hours for st in steps)
    if over:
        return "would exceed the budget"
    tried = min(len(cands), CANDIDATE_NODES)
    return too_few() or (
        f"the small jobs on the {tried} nodes nearest to {gpus} free GPUs have nowhere else to go"
    )


def _clear_node(
    work: Fleet, node: Node, jids: list[str], targeted: set[str], clock: tuple[float, float | None]
) -> list[_Step] | None:
    """Move ``jids`` off ``node`` (re-placed by rackwise on other nodes, never in a rack
    being cleared); applied to ``work``, or undone and None if one has nowhere to go."""
    restart_minutes, now = clock
    work.set_health(node.id, DRAINING)  # nothing may land on it meanwhile
    steps: list[_Step] = []
    try:
        for jid in jids:
            alloc = work.release(jid)
            plan = place(work, alloc.job, exclude=targeted)
            if not plan.placed:
                work.allocate(alloc, restore=True)
                _undo(work, steps)
                return None
            new = plan.allocation(alloc.job)
            new.expected_end, new.started_at = alloc.expected_end, now
            work.allocate(new)
            c = restart_cost_gpu_hours(
                alloc.job, alloc.gpus, restart_minutes, now=now, started_at=alloc.started_at
            )
            steps.append(
                _Step(
                    Move(
                        jid,
                        list(alloc.nodes),
                        dict(new.nodes),
                        new.segments,
                        c,
                        f"move off {node.label} to free GPUs there: {plan.reason}",
                    ),
                    alloc,
                )
            )
    finally:
        work.set_health(node.id, HEALTHY)
    return steps
