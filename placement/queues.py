"""Queue disciplines for the baselines: Slurm's backfill with reservations.

``sched/backfill`` (Slurm's default scheduler; ``src/plugins/sched/backfill/backfill.c``,
slurm.conf(5) ``SchedulerParameters``), as the simulator models it:

1. Pending jobs are visited in priority order (the caller's order: priority, then
   submit time, then trace order; see placement/README.md).
2. A job starts now if the block plugin can place it on nodes that no reservation
   holds during ``[now, now + expected run)``: a job that ends before a reservation
   begins may use the reserved nodes (that is what backfill means).
3. A job that cannot start, once it has been pending ``bf_min_age_reserve`` (default
   0), gets a reservation: the earliest time within ``bf_window`` (default 1440 min)
   at which the block plugin could place it, given the running jobs' expected ends
   and the reservations made before it in this cycle, and the nodes it would get
   then (a gang's nodes whole, a single-node job's GPUs on one node). They are held
   for ``[start, start + expected run)``.
4. Reservations are recomputed from scratch on every cycle (Slurm's backfill does the
   same: each cycle starts from the running jobs and plans the queue again). Given
   ``kept``, the cycle's first reservation may instead be a hold an earlier cycle
   made for the same job, while it is still the earliest (:meth:`Backfill._reuse`;
   rackwise's queue in the simulator does this, slurm-block does not).
5. A reservation is made when first needed (``reserve_later``): when a job behind it
   could start around the holds made so far. Placement is monotone in the free nodes,
   so a job that cannot start around fewer holds cannot around more, and every start
   is the one reservations made at once would allow; most cycles start nothing after
   their first blocked job, and are thrown away when capacity comes back.

Simplifications, stated: expected runs are the trace's real durations (Slurm uses
time limits, which are longer); at most ``max_reservations`` jobs are reserved per
cycle (Slurm bounds a cycle by ``bf_max_job_test``, default 500, and by time).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from placement.model import HEALTHY, Fleet, JobRequest, Node, Rack
from placement.plans import PlacementPlan, not_placed
from placement.policies.common import Context, min_racks
from placement.timeline import HeldView, LaterView, NodeEnds, jobs_on, replace_sorted

# slurm.conf(5), SchedulerParameters: bf_window=1440 (minutes), bf_min_age_reserve=0 (s).
BF_WINDOW_S = 1440 * 60.0
BF_MIN_AGE_RESERVE_S = 0.0
BF_MAX_RESERVATIONS = 16


def expansion_factor(waited: float, run: float, tau: float = 600.0) -> float:
    """A pending job's bounded slowdown so far, ``max(1, (waited + run) / max(run,
    tau))``: rackwise's backfill visits the queue by this, largest first
    (LXF-backfill: Chiang, Arpaci-Dusseau and Vernon, "The impact of more accurate
    requested runtimes on production job scheduling performance", JSSPP 2002; tau as
    in bounded slowdown, Feitelson, JSSPP 2001). Short jobs rise
    fast, a long one rises as it waits, so none starves; a job that has not waited
    has the lowest factor, 1."""
    return max(1.0, (waited + run) / max(run, tau))


PolicyFn = Callable[[Fleet, JobRequest, list[Rack], Context], PlacementPlan]
# (job, racks of one shape) -> test(idle nodes per rack id): could the policy place it?
RoomFn = Callable[[JobRequest, list[Rack]], Callable[[dict[str, int]], bool]]
# (fleet, gang, context) -> could the policy place it on the fleet's idle nodes? False
# only when it certainly cannot (read from the fleet's indexes).
IdleRoomFn = Callable[[Fleet, JobRequest, Context], bool]


@dataclass(frozen=True)
class Hold:
    """GPUs reserved for ``job_id`` from ``start`` to ``end``: node id -> GPU count
    (a gang holds its nodes whole, a single-node job its GPUs on one node)."""

    job_id: str
    start: float
    end: float
    gpus: dict[str, int]
    nodes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", frozenset(self.gpus))


def by_tier(
    fleet: Fleet, job: JobRequest, attempt: Callable[[frozenset[str]], PlacementPlan]
) -> PlacementPlan:
    """``attempt(racks left out)`` over the tiers of racks reserved for tenants
    (:meth:`Fleet.reservation_tiers`: the job's tenant's own, then the unreserved,
    then every rack: another tenant's reserved rack is lent while idle). The plan
    over the fewest racks wins, the earliest tier among equals, so a tier never
    makes a job span more racks than the whole fleet would."""
    best: PlacementPlan | None = None
    plan = not_placed(job, "", "the fleet has no racks")
    least = least_racks(fleet, job)
    for tier in fleet.reservation_tiers(job.tenant):
        if tier and len(tier) >= len(fleet.racks):
            continue
        plan = attempt(tier)
        if plan.placed:
            if len(plan.racks) <= least:
                return plan
            if best is None or len(plan.racks) < len(best.racks):
                best = plan
    return best or plan


def least_racks(fleet: Fleet, job: JobRequest) -> int:
    """The fewest racks any placement of ``job`` can use (1 for a job one rack
    of some shape holds)."""
    counts = [
        1 if job.is_small(g) else min_racks(job.nodes_needed(g), size, job.segment_nodes)
        for g, size in fleet.group_size.items()
        if job.is_small(g) or job.nodes_needed(g)
    ]
    return min((c for c in counts if c), default=1)


def degraded_for(fleet: Fleet, job: JobRequest) -> frozenset[str]:
    """The racks ``job`` must keep off: those with a degraded NVLink fabric, for a
    multi-node gang (one-node work may still go there)."""
    if fleet.degraded and not one_node(fleet, job):
        return fleet.degraded
    return frozenset()


def one_node(fleet: Fleet, job: JobRequest) -> bool:
    """Does ``job`` fit on one node of some shape of the fleet (a job sharing a
    node, or a whole-node job of one node)? Such work rides out a degraded NVLink
    fabric: it needs no NVLink between nodes."""
    return any(job.is_small(g) or job.nodes_needed(g) == 1 for g in fleet.groups)


def degraded_note(fleet: Fleet, racks: frozenset[str]) -> str:
    names = ", ".join(sorted(fleet.rack_by_id[r].label for r in racks))
    return f"; gangs are kept off {names} (NVLink fabric degraded)"


def decide(
    fleet: Fleet, job: JobRequest, fn: PolicyFn, racks_by_gpn: dict[int, list[Any]], ctx: Context, name: str
) -> PlacementPlan:
    """``fn`` over each rack shape (as :func:`placement.place.place` does); the plan
    that needs the fewest racks wins. Reserved racks: :func:`by_tier`; degraded
    racks: :func:`degraded_for`."""
    avoid = degraded_for(fleet, job)
    if avoid:
        racks_by_gpn = {g: [r for r in rs if r.id not in avoid] for g, rs in racks_by_gpn.items()}
        plan = _decide_reserved(fleet, job, fn, racks_by_gpn, ctx, name)
        if not plan.placed:
            plan.reason += degraded_note(fleet, avoid)
        return plan
    return _decide_reserved(fleet, job, fn, racks_by_gpn, ctx, name)


def _decide_reserved(
    fleet: Fleet, job: JobRequest, fn: PolicyFn, racks_by_gpn: dict[int, list[Any]], ctx: Context, name: str
) -> PlacementPlan:
    if not fleet.reservations:
        return _decide(fleet, job, fn, racks_by_gpn, ctx, name)

    def outside(out: frozenset[str]) -> dict[int, list[Any]]:
        if racks_by_gpn is fleet.groups:
            return fleet.groups_outside(out)
        return {g: [r for r in rs if r.id not in out] for g, rs in racks_by_gpn.items()}

    return by_tier(fleet, job, lambda out: _decide(fleet, job, fn, outside(out), ctx, name))


def _decide(
    fleet: Fleet, job: JobRequest, fn: PolicyFn, racks_by_gpn: dict[int, list[Any]], ctx: Context, name: str
) -> PlacementPlan:
    best: PlacementPlan | None = None
    reasons: list[str] = []
    for gpn, racks in racks_by_gpn.items():
        if not job.is_small(gpn) and job.nodes_needed(gpn) == 0:
            continue
        plan = fn(fleet, job, racks, ctx)
        if not plan.placed:
            reasons.append(plan.reason)
        elif best is None or (len(plan.racks), len(plan.nodes)) < (len(best.racks), len(best.nodes)):
            best = plan
    return best or not_placed(job, name, "; ".join(reasons) or "no rack of a usable shape")


def _distinct(values: Iterable[float]) -> Iterator[float]:
    """Sorted ``values`` without repeats (read lazily: a search stops early)."""
    last = None
    for v in values:
        if v != last:
            last = v
            yield v


class Backfill:
    """One backfill cycle at ``now`` over ``fleet`` (see the module docstring)."""

    def __init__(
        self,
        fleet: Fleet,
        now: float,
        fn: PolicyFn,
        name: str,
        *,
        window_s: float = BF_WINDOW_S,
        min_age_reserve_s: float = BF_MIN_AGE_RESERVE_S,
        max_reservations: int = BF_MAX_RESERVATIONS,
        room: RoomFn | None = None,
        ends: NodeEnds | None = None,
        kept: dict[str, Hold] | None = None,
        idle_room: IdleRoomFn | None = None,
    ) -> None:
        self.fleet = fleet
        # Job id -> the hold an earlier cycle made first, that this cycle's first
        # reservation may reuse (see _reuse); kept up to date here, if given.
        self.kept = kept
        self._shared = ends
        self.now = now
        self.fn = fn
        self.name = name
        self.window_s = window_s
        self.min_age_reserve_s = min_age_reserve_s
        self.max_reservations = max_reservations
        self.room = room
        self.idle_room = idle_room
        self._rack_ends: dict[str, list[float]] = {}
        self.holds: list[Hold] = []
        # Which holds overlap -> GPUs they hold per node (held_during); id of such a
        # dict -> its nodes' slots by rack (_start_around).
        self._held: dict[tuple[int, ...], dict[str, int]] = {}
        self._held_slots: dict[int, dict[str, list[int]]] = {}
        self.ctx = Context(now=now)
        self._free_at: dict[str, float] | None = None
        self._ends: list[float] = []
        # GPUs -> (time the running jobs leave that many free, group position, node),
        # sorted, for single-node reservations; dropped when a job starts.
        self._small_ready: dict[int, list[tuple[float, int, Node]]] = {}
        self._pos: dict[str, int] | None = None
        self._room_memo: dict[tuple[object, ...], float] = {}  # see _first_room
        # (shape, duration) that found no start in the window, with the hold count then.
        self._no_start: dict[tuple[object, ...], int] = {}
        # shape -> (run, start) of its last reservation: a job of that shape that runs
        # at least as long cannot start earlier (holds only grow during a cycle).
        self._not_before: dict[tuple[object, ...], tuple[float, float]] = {}
        # reserve_later's calls not made yet, each with the cycle time it was asked at.
        self._deferred: list[tuple[float, JobRequest, float, float, tuple[object, ...]]] = []

    # -- now --------------------------------------------------------------------------

    def held_during(self, start: float, end: float) -> dict[str, int]:
        """GPUs held per node by reservations that overlap ``[start, end)``."""
        sig = tuple(i for i, h in enumerate(self.holds) if h.start < end and h.end > start)
        out = self._held.get(sig)
        if out is None:  # holds never change, only get added: keep it by which overlap
            out = self._held[sig] = {}
            for i in sig:
                for nid, g in self.holds[i].gpus.items():
                    out[nid] = out.get(nid, 0) + g
        return out

    def held_nodes(self, start: float, end: float) -> set[str]:
        """Nodes with any reservation overlapping ``[start, end)``."""
        self.flush()
        out: set[str] = set()
        for h in self.holds:
            if h.start < end and h.end > start:
                out |= h.nodes
        return out

    def try_start(self, job: JobRequest, duration: float) -> PlacementPlan:
        """Where ``job`` may start now without delaying any reservation; deferred
        ones are made first if it could start without them (step 5)."""
        plan = self._try_start(job, duration)
        # Decided again only if a hold made now begins before the job would end.
        if plan.placed and any(h.start < self.now + duration for h in self.flush()):
            plan = self._try_start(job, duration)
        return plan

    def _try_start(self, job: JobRequest, duration: float) -> PlacementPlan:
        held = self.held_during(self.now, self.now + duration)
        groups: dict[int, list[Any]] = self.fleet.groups  # racks, or views of them (HeldView)
        if held and not any(job.is_small(gpn) for gpn in groups):
            return self._start_around(job, held)
        if held:
            nodes = self.fleet.nodes
            touched = {nodes[nid].rack for nid in held}
            groups = {
                gpn: [
                    self._now_view(r, held, job.num_gpus if job.is_small(gpn) else None)
                    if r.id in touched
                    else r
                    for r in racks
                ]
                for gpn, racks in groups.items()
            }
        return decide(self.fleet, job, self.fn, groups, self.ctx, self.name)

    def _start_around(self, job: JobRequest, held: dict[str, int]) -> PlacementPlan:
        """A gang's decision with the held nodes out of the fleet's idle sets for it
        (:meth:`Fleet.hold_back`): a gang takes idle nodes only, so it sees what a
        view without them would show, and the policy reads the fleet's indexes instead
        of scanning views. ``idle_room``, if given, is asked first."""
        slots = self._held_slots.get(id(held))
        if slots is None:
            slots = {}
            for nid in held:
                node = self.fleet.nodes[nid]
                slots.setdefault(node.rack, []).append(node.index)
            self._held_slots[id(held)] = slots  # held lives as long as self._held
        fleet = self.fleet
        taken = fleet.hold_back(slots)
        try:
            if self.idle_room is not None and not self.idle_room(fleet, job, self.ctx):
                return not_placed(job, self.name, "not enough idle nodes besides the held")
            return decide(fleet, job, self.fn, fleet.groups, self.ctx, self.name)
        finally:
            fleet.give_back(taken)

    @staticmethod
    def _now_view(rack: Rack, held: dict[str, int], small: int | None) -> HeldView:
        # A gang may not use a node with any reservation on it; a single-node job may
        # use the GPUs the reservations leave.
        nodes = [
            n
            for n in rack.nodes
            if n.id not in held or (small is not None and n.free_gpus - held[n.id] >= small)
        ]
        return HeldView(rack, {n.index for n in nodes if n.index in rack.free and n.id not in held}, nodes)

    def started(self, job_id: str) -> None:
        """A job was allocated in this cycle: its nodes are busy until it ends."""
        if self.kept is not None:
            self.kept.pop(job_id, None)
        if self._free_at is None:
            return  # read from the fleet when first needed
        alloc = self.fleet.allocations[job_id]
        end = math.inf if alloc.expected_end is None else alloc.expected_end
        racks: set[str] = set()
        for nid in alloc.nodes:
            old = self._free_at[nid]
            if end > old:
                replace_sorted(self._ends, old, end)
                self._free_at[nid] = end
                racks.add(self.fleet.nodes[nid].rack)
        self._small_ready.clear()
        self._room_memo.clear()
        for rid in racks:
            self._rack_ends[rid] = sorted(self._free_at[n.id] for n in self.fleet.rack_by_id[rid].nodes)
        if self._shared is not None and self.fleet.changed is not None:
            # The shared node ends were refreshed when first read, and only this start
            # changed these nodes since: they hold what a refresh would recompute.
            self.fleet.changed.difference_update(alloc.nodes)

    # -- later ------------------------------------------------------------------------

    def _ensure_free_at(self) -> dict[str, float]:
        if self._free_at is None:
            ends = self._shared or NodeEnds(self.fleet, track=False)
            ends.refresh()
            self._free_at = ends.free_at
            self._ends, self._rack_ends = ends.ends, ends.rack_ends
        return self._free_at

    def reserve_later(
        self, job: JobRequest, duration: float, submit: float, key: tuple[object, ...] = ()
    ) -> None:
        """:meth:`reserve`, made when something first reads the holds (step 5):
        :meth:`try_start` for a job that could start, :meth:`held_nodes`,
        :meth:`reserve`."""
        if len(self.holds) < self.max_reservations:  # else reserve would refuse it
            self._deferred.append((self.now, job, duration, submit, key))

    def flush(self) -> list[Hold]:
        """Make the deferred reservations, in order, each at the time it was asked
        (an incremental cycle moves ``now``); returns the holds added."""
        if not self._deferred:
            return []
        todo, self._deferred = self._deferred, []
        n, now = len(self.holds), self.now
        try:
            for at, job, duration, submit, key in todo:
                self.now = self.ctx.now = at
                self._reserve(job, duration, submit, key)
        finally:
            self.now = self.ctx.now = now
        return self.holds[n:]

    def reserve(
        self, job: JobRequest, duration: float, submit: float, key: tuple[object, ...] = ()
    ) -> Hold | None:
        """Reserve the earliest start of a job that cannot start now (step 3)."""
        self.flush()
        return self._reserve(job, duration, submit, key)

    def _reserve(
        self, job: JobRequest, duration: float, submit: float, key: tuple[object, ...]
    ) -> Hold | None:
        if len(self.holds) >= self.max_reservations:
            return None
        if self.now - submit < self.min_age_reserve_s:
            return None
        kept = self._reuse(job, duration)
        if kept is not None:
            self.holds.append(kept)
            if key:
                self._not_before[key] = (duration, kept.start)
            return kept
        memo = (key, duration)
        if any(job.is_small(gpn) for gpn in self.fleet.groups):
            return self._reserve_small(job, duration, key)
        if self._no_start.get(memo) == len(self.holds):
            return None
        free_at = self._ensure_free_at()
        need = min((job.nodes_needed(g) for g in self.fleet.groups if job.nodes_needed(g)), default=0)
        horizon = self.now + self.window_s
        earliest = self.now
        prev = self._not_before.get(key) if key else None
        if prev is not None and duration >= prev[0]:
            earliest = math.nextafter(prev[1], -math.inf)  # prev[1] itself may do
        tests = (
            [
                self.room(job, racks)
                for gpn, racks in self.fleet.groups.items()
                if not job.is_small(gpn) and job.nodes_needed(gpn)
            ]
            if self.room is not None
            else []
        )
        blocks = [b for test in tests for b in getattr(test, "blocks", [([], 0, None)])]
        one_rack = (
            min(-(-n // seg) * seg if seg else n for _, n, seg in blocks)
            if blocks and all(len(ids) == 1 for ids, _, _ in blocks)
            else None
        )
        if one_rack is not None:
            # Every block one rack (the _first_room of each, inline): the first time
            # one of them has room, holds aside.
            first = math.inf
            for ids, n, seg in blocks:
                rack_ends = self._rack_ends[ids[0]]
                m = -(-n // seg) * seg if seg else n
                if m <= len(rack_ends) and rack_ends[m - 1] < first:
                    first = rack_ends[m - 1]
        else:
            first = min((self._first_room(b) for b in blocks), default=self.now)
        ends = self._ends
        lo = max(bisect.bisect_right(ends, earliest), bisect.bisect_left(ends, first))
        times = _distinct(
            heapq.merge(
                (ends[i] for i in range(lo, bisect.bisect_right(ends, horizon))),
                sorted({h.end for h in self.holds if earliest < h.end <= horizon}),
            )
        )
        views_at: dict[tuple[str, int], LaterView] = {}  # see below
        for t in times:
            # Cheap bounds first: enough nodes idle by then (in one block of the job's
            # level), then the same without the held ones.
            if t < first or bisect.bisect_right(self._ends, t) < need:
                continue
            avail = {rid: bisect.bisect_right(ends, t) for rid, ends in self._rack_ends.items()}
            if tests and not any(test(avail) for test in tests):
                continue
            held = self.held_nodes(t, t + duration)
            busy = [nid for nid in held if free_at[nid] <= t]
            if len(busy) and bisect.bisect_right(self._ends, t) - len(busy) < need:
                continue
            if busy:
                for nid in busy:
                    avail[self.fleet.nodes[nid].rack] -= 1
                if tests and not any(test(avail) for test in tests):
                    continue
            # avail[r] is now the count of r's nodes free by t and not held. Without
            # holds a view depends on that count alone (the nodes that free first),
            # so a later time reuses it.
            cache = views_at if not held else {}
            touched = {self.fleet.nodes[nid].rack for nid in held} if held else set()
            if one_rack is not None:
                # Only a rack that holds the whole job by itself can take it.
                groups = {
                    gpn: views
                    for gpn, racks in self.fleet.groups.items()
                    if (
                        views := [
                            self._later_view(r, free_at, t, held, touched, avail[r.id], cache)
                            for r in racks
                            if avail[r.id] >= one_rack
                        ]
                    )
                }
            else:
                groups = {
                    gpn: [self._later_view(r, free_at, t, held, touched, avail[r.id], cache) for r in racks]
                    for gpn, racks in self.fleet.groups.items()
                }
            plan = decide(self.fleet, job, self.fn, groups, self.ctx, self.name)
            if plan.placed:
                hold = Hold(job.id, t, t + duration, {nid: len(g) for nid, g in plan.nodes.items()})
                if self.kept is not None and not self.holds:
                    self.kept[job.id] = hold
                self.holds.append(hold)
                if key:
                    self._not_before[key] = (duration, t)
                return hold
        self._no_start[memo] = len(self.holds)
        return None

    def _reuse(self, job: JobRequest, duration: float) -> Hold | None:
        """The job's kept hold, for this, the cycle's first reservation, if it is for
        the same run, starts later than now, and is on nodes still healthy whose
        running jobs all end by its start; one that is not is forgotten. The caller
        keeps holds only while no capacity came back early (a failure, a requeue, a
        repair, a move): running jobs then end when expected and new ones only take
        nodes, so no earlier start has opened and the kept hold is still the earliest
        (the nodes a fresh plan would pick may differ)."""
        kept = self.kept.get(job.id) if self.kept is not None and not self.holds else None
        if kept is None:
            return None
        if kept.end == kept.start + duration and kept.start > self.now:
            nodes, allocs, start = self.fleet.nodes, self.fleet.allocations, kept.start
            for nid in kept.gpus:
                node = nodes[nid]
                if node.health != HEALTHY or any(
                    (end := allocs[j].expected_end) is None or end > start for j in node.jobs
                ):
                    break
            else:
                return kept
        if self.kept is not None:
            del self.kept[job.id]
        return None

    def _first_room(self, block: tuple[list[str], int, int | None]) -> float:
        """The first time the running jobs' ends leave ``n`` idle nodes (in whole
        segments) over the block's racks, holds aside: no earlier time can pass the
        room test. A block without racks gives no bound."""
        ids, n, seg = block
        if not ids:
            return -math.inf
        memo = self._room_memo.get((tuple(ids), n, seg)) if len(ids) > 1 else None
        if memo is not None:
            return memo
        if len(ids) == 1:
            ends = self._rack_ends[ids[0]]
            m = -(-n // seg) * seg if seg else n
            return ends[m - 1] if m <= len(ends) else math.inf
        # A rack adds a whole segment when its seg-th, 2seg-th, ... node frees up: the
        # answer is the (n // seg)-th of those times over the block's racks (a shorter
        # last segment may take any leftover, so it gives no bound; with no segments,
        # the n-th node end; over the whole fleet, read from the ends).
        unit = seg or 1
        want = n // unit
        if unit == 1 and len(ids) == len(self._rack_ends):
            times = self._ends
        else:
            times = sorted(t for r in ids for t in self._rack_ends[r][unit - 1 :: unit])
        out = times[want - 1] if want <= len(times) else math.inf
        self._room_memo[(tuple(ids), n, seg)] = out
        return out

    @staticmethod
    def _later_view(
        rack: Rack,
        free_at: dict[str, float],
        t: float,
        held: set[str],
        touched: set[str],
        count: int,
        cache: dict[tuple[str, int], LaterView],
    ) -> Rack | LaterView:
        """The rack at ``t`` (``count`` of its nodes free by then and not held), from
        ``cache`` by (rack, count) if it has it. A rack with no held node whose nodes
        free by then are just the idle ones (no running job ends by ``t``; most racks,
        whose idle nodes are their spares) is the rack itself: a gang's decision reads
        its idle set, the same as the view's."""
        if count == len(rack.free) and rack.id not in touched:
            return rack
        view = cache.get((rack.id, count))
        if view is None:
            view = cache[(rack.id, count)] = LaterView(rack, count, free_at, t, held)
        return view

    def _ready_list(self, g: int) -> list[tuple[float, int, Node]]:
        """(when the running jobs leave ``g`` GPUs free, group position, node) for the
        healthy nodes of the shapes a ``g``-GPU job fits on one node of, sorted."""
        got = self._small_ready.get(g)
        if got is not None:
            return got
        out: list[tuple[float, int, Node]] = []
        for nid, pos in self._node_pos.items():
            node = self.fleet.nodes[nid]
            if node.health != HEALTHY or node.gpus < g:
                continue
            jobs = sorted(jobs_on(self.fleet, node))
            used = sum(x for _, x in jobs)
            ready = self.now
            for end, x in jobs:
                if node.gpus - used >= g:
                    break
                used -= x
                ready = end
            if node.gpus - used >= g:
                out.append((ready, pos, node))
        out.sort(key=lambda r: (r[0], r[1]))
        self._small_ready[g] = out
        return out

    @property
    def _node_pos(self) -> dict[str, int]:
        """Node id -> position in group order, over the groups that hold single-node
        jobs (the block plugin's tie-break: lowest-numbered node)."""
        if self._pos is None:
            self._pos = {}
            i = 0
            for racks in self.fleet.groups.values():
                for rack in racks:
                    for node in rack.nodes:
                        i += 1
                        self._pos[node.id] = i
        return self._pos

    def _reserve_small(self, job: JobRequest, duration: float, key: tuple[object, ...]) -> Hold | None:
        """A single-node job's reservation: the node where its GPUs are free soonest
        for ``duration`` (lowest-numbered node on a tie, as the block plugin picks)."""
        self._ensure_free_at()
        horizon = self.now + self.window_s
        on_node: dict[str, list[tuple[float, float, int]]] = {}
        for h in self.holds:
            for nid, g in h.gpus.items():
                on_node.setdefault(nid, []).append((h.start, h.end, g))
        g = job.num_gpus
        earliest = self.now
        prev = self._not_before.get(key) if key else None
        if prev is not None and duration >= prev[0]:
            earliest = prev[1]  # the same shape, no shorter: not before its start
        # Nodes no reservation touches: the running jobs alone say when g GPUs are free.
        best: tuple[float, int, Node] | None = None
        for ready, pos, node in self._ready_list(g):
            t = max(ready, earliest)
            if t > horizon or (best is not None and (t, pos) >= best[:2]):
                if ready > earliest:
                    break  # sorted by ready time: no later node starts sooner
                continue
            if node.id not in on_node:
                best = (t, pos, node)
        # Nodes with reservations: try the times jobs and holds end.
        for nid, holds in on_node.items():
            node = self.fleet.nodes[nid]
            at = self._node_pos.get(nid)
            if at is None or node.health != HEALTHY or node.gpus < g:
                continue
            jobs = jobs_on(self.fleet, node)
            cands = sorted(
                {earliest}
                | {e for e, _ in jobs if earliest < e <= horizon}
                | {e for _, e, _ in holds if earliest < e <= horizon}
            )
            for t in cands:
                if best is not None and (t, at) >= best[:2]:
                    break
                used = sum(x for e, x in jobs if e > t) + sum(
                    x for s0, e, x in holds if s0 < t + duration and e > t
                )
                if node.gpus - used >= g:
                    best = (t, at, node)
                    break
        if best is None:
            return None
        hold = Hold(job.id, best[0], best[0] + duration, {best[2].id: job.num_gpus})
        self.holds.append(hold)
        if key:
            self._not_before[key] = (duration, best[0])
        return hold
