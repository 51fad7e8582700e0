"""``rackwise``: rack-local best fit with slice sizing, equal segments, and packing.

1. Single-node jobs: best fit onto a partly used node (fewest free GPUs that fit), in
   the busiest rack; else an idle node in the busiest rack that has one. Whole racks
   stay free for gangs. Small jobs may use a rack's spare nodes ("borrow" them).
2. Gangs that fit in one rack: the rack whose offer is the smallest that holds the gang
   (best fit). A non-preemptible gang is offered the idle nodes minus the spares the
   rack keeps (18 healthy nodes: a 16-node slice and 2 hot spares). Preemptible gangs
   may borrow spares (recovery reclaims them), and so may gangs of at most
   ``spare_nodes`` nodes, and a gang bigger than a slice (splitting it would cost far
   more than the spares are worth).
3. Gangs bigger than a rack go over the fewest racks, split into equal segments
   (24 -> 12+12, not 16+8), each segment best fit onto the rack with the smallest
   offer that holds it; only when no such racks exist now, unequal segments over the
   same number of racks (16+8), which costs no extra rack.
4. A gang that is not ``required`` may span more racks than it needs only once it
   has waited SPAN_PATIENCE times what the slowdown would cost it
   (``expected_duration * F / (1 - F)``, F the cross-rack slowdown). The default is
   infinite: with a clock (``now``) it waits. Without a clock it spans at once, for
   interactive what-ifs. Locality ``none`` says the user accepts a span, not that a
   span is free.
5. A gang in segments (``segment_nodes`` below its size) is placed in those
   segments, each whole inside one rack, over the fewest racks that hold them now,
   whatever its locality: the segments are the locality it asked for (``required``
   means each segment inside one rack, as Slurm's ``--segment``), so step 4 does not
   apply. In one rack when one holds them all (best fit), else each segment best fit
   onto the fewest racks, or onto the racks with the most room when best fit spends
   them on small offers. A rack lends its spares to a segmented gang by the size of
   a segment, the part that must sit whole in it (:func:`may_borrow`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable

from placement.model import REQUIRED, Fleet, JobRequest, Node, Rack
from placement.plans import PlacementPlan, not_placed
from placement.policies.common import (
    Context,
    fewest_racks,
    min_racks,
    segment_of,
    segment_sizes,
    small_plan,
    whole_node_plan,
)

NAME = "rackwise"
CROSS_RACK_SLOWDOWN = 0.43
# A gang that fits in fewer racks waits for them; it spans more only after waiting
# SPAN_PATIENCE times what the slowdown would cost it. Infinite by default: on
# tracegen workloads any spanning lost more (slowdown, longer queues) than it saved.
SPAN_PATIENCE = float("inf")


def rackwise(fleet: Fleet, job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    gpn = racks[0].gpus_per_node
    if job.is_small(gpn):
        return _small(fleet, job, racks, ctx)
    n = job.nodes_needed(gpn)
    size = fleet.group_size[gpn]
    seg = segment_of(job.segment_nodes, n)
    if seg and seg > size:
        return not_placed(job, NAME, f"segment of {seg} nodes is larger than any rack")
    if seg and seg < n:
        return _segmented(fleet, job, racks, n, seg, ctx)  # step 5
    if n <= size:
        plan = _one_rack(fleet, job, racks, n, ctx)
        if plan.placed or job.locality == REQUIRED or seg:
            return plan  # (a job that is one segment cannot span)
        if not may_span(job, ctx):
            return not_placed(
                job, NAME, plan.reason + "; spanning racks would cost more than waiting so far, so it waits"
            )
        spill = _many_racks(fleet, job, racks, n, ctx, k_start=2)
        if spill.placed:
            spill.choices.insert(0, plan.reason)
        else:
            spill.reason = f"{plan.reason}; {spill.reason}"
        return spill
    return _many_racks(fleet, job, racks, n, ctx, k_start=min_racks(n, size, None))


def may_span(job: JobRequest, ctx: Context) -> bool:
    """May this gang span more racks than it needs, now? (See step 4 above.)"""
    if ctx.now is None or job.submit_time is None or job.expected_duration is None:
        return True
    penalty = job.expected_duration * CROSS_RACK_SLOWDOWN / (1 - CROSS_RACK_SLOWDOWN)
    return ctx.now - job.submit_time >= SPAN_PATIENCE * penalty


def idle_room(fleet: Fleet, job: JobRequest, ctx: Context) -> bool:
    """Could :func:`rackwise` place ``job`` on the idle nodes now? False only when it
    certainly cannot: even the racks with the most idle nodes, as many as the job may
    use, do not hold it in whole segments (an offer is at most a rack's idle count,
    reservations only take nodes away). Read from the idle-count index, for a queue
    pass to skip decisions that cannot succeed."""
    spread = job.locality != REQUIRED and may_span(job, ctx)
    for gpn, index in fleet.by_free.items():
        if job.is_small(gpn):
            return True
        n = job.nodes_needed(gpn)
        size = fleet.group_size[gpn]
        seg = segment_of(job.segment_nodes, n)
        if not n or (seg and seg > size):
            continue
        if seg and seg < n:
            top = index[n // -seg :]  # as many racks as segments: each holds one at least
        else:
            top = index if spread and not seg else index[-min_racks(n, size, None) :]
        if idle_holds([f for f, _ in top], n, seg):
            return True
    return False


def idle_holds(idle: list[int], n: int, seg: int | None) -> bool:
    """Do racks with these idle-node counts hold ``n`` nodes in whole segments of
    ``seg``? A necessary condition for rackwise to place a gang on them (an offer is
    at most a rack's idle count)."""
    return sum(idle) >= n and (not seg or sum(f // seg for f in idle) >= n // seg)


def may_borrow(rack: Rack, n: int, preemptible: bool, whole: int | None = None) -> bool:
    """May a gang of ``n`` nodes use this rack's spares? Preemptible gangs may (recovery
    can reclaim the nodes), so may gangs of at most ``spare_nodes`` nodes, and gangs too
    big for the slice (splitting them would cost far more than the spares are worth).
    ``whole``: the part of the gang that must sit whole in the rack, when that is less
    than the gang (its segment); it is what must fit the slice."""
    return (
        preemptible or n <= rack.spare_nodes or (n if whole is None else whole) > rack.size - rack.spare_nodes
    )


def _offer(rack: Rack, ctx: Context, borrow: bool) -> int:
    if rack.id in ctx.reserved:
        return 0
    return rack.free_count if borrow else rack.slice_offer()


def _one_rack(
    fleet: Fleet, job: JobRequest, racks: list[Rack], n: int, ctx: Context, seg: int | None = None
) -> PlacementPlan:
    """The rack with the smallest offer that holds all ``n`` nodes (best fit); with
    ``seg``, in segments of that size (each rack lends spares by the segment)."""
    best: tuple[int, int, int, Rack] | None = None
    gpn = racks[0].gpus_per_node
    if racks is fleet.groups.get(gpn):
        # The whole group: racks with n idle nodes or more from the index, fewest idle
        # first. An offer is at most max_spares below the idle count, so once a rack's
        # idle count minus that is no better than the best offer, none later can win.
        slack = fleet.max_spares[gpn]
        cands: Iterable[tuple[int, int, Rack]] = fleet.racks_with_idle(gpn, n)
    else:
        slack = -1  # a filtered list: scan it
        cands = ((r.free_count, pos, r) for pos, r in enumerate(racks) if r.free_count >= n)
    for free, pos, rack in cands:
        if slack >= 0 and best is not None and free - slack >= best[0]:
            break
        offer = _offer(rack, ctx, may_borrow(rack, n, job.preemptible, seg))
        if offer >= n:
            key = (offer, rack.free_count, pos)
            if best is None or key < best[:3]:
                best = (offer, rack.free_count, pos, rack)
    if best is None:
        return not_placed(job, NAME, f"no rack offers {n} idle nodes beyond its spares")
    rack = best[3]
    why = (
        f"best fit: {rack.label} offers {best[0]} idle nodes (keeping "
        f"{rack.free_count - best[0]} spare), the fewest that hold {n}"
    )
    slots = rack.idle_slots()[:n]
    picks = [(rack, slots[i : i + seg]) for i in range(0, n, seg)] if seg else [(rack, slots)]
    if seg:
        why += f" in segments of {seg}"
    return whole_node_plan(fleet, job, NAME, picks, why, [why])


def _split(n: int, k: int) -> list[int]:
    base, extra = divmod(n, k)
    return [base + 1] * extra + [base] * (k - extra)


def _segmented(
    fleet: Fleet, job: JobRequest, racks: list[Rack], n: int, seg: int, ctx: Context
) -> PlacementPlan:
    """Step 5: a gang in segments of ``seg`` (fewer than its ``n`` nodes), each whole
    in one rack, over the fewest racks, at any locality. A rack offers its idle nodes
    less the spares it keeps, unless it lends them by the segment (:func:`may_borrow`).

    1. One rack, when one holds them all: the smallest offer that does (best fit),
       read from the index (:func:`_one_rack`), which stops early.
    2. Cheap reject, with the whole group: offers are at most idle counts, and a rack
       used holds a segment at least, so the racks with the most idle nodes, as many
       as there are segments, must hold the segments.
    3. The offers of the racks with room for the shortest segment, largest first; the
       fewest racks k are the first that hold the segments (:func:`fewest_racks`:
       the first k are as good as any k).
    4. Each segment best fit onto at most k racks (:func:`_best_fit`), or, when best
       fit spends the k racks on small offers, onto the first k offers, which hold
       them (:func:`_fill`).
    """
    sizes = segment_sizes(n, seg)
    gpn = racks[0].gpus_per_node
    shortest = sizes[-1]
    whole = racks is fleet.groups.get(gpn)
    if n <= fleet.group_size[gpn]:
        # Step 1 first: a busy fleet rarely needs the offers of every rack below.
        plan = _one_rack(fleet, job, racks, n, ctx, seg)
        if plan.placed:
            return plan
    if whole:
        most = [f for f, _ in reversed(fleet.by_free.get(gpn, [])[-len(sizes) :])]
        if fewest_racks(most, n, seg) is None:
            return not_placed(
                job, NAME, _segment_room(n, seg, sizes, most, "the racks with the most idle nodes have")
            )
        pos = fleet.group_pos
        cands: Iterable[Rack] = (r for _, _, r in fleet.racks_with_idle(gpn, shortest))
    else:
        pos = {r.id: i for i, r in enumerate(racks)}
        cands = (r for r in racks if r.free_count >= shortest)
    offers = []
    for r in cands:
        o = _offer(r, ctx, may_borrow(r, n, job.preemptible, seg))
        if o >= shortest:
            offers.append((o, pos[r.id], r))
    offers.sort(key=lambda x: (-x[0], x[1]))  # largest offer first, ties in group order
    k = fewest_racks((o for o, _, _ in offers), n, seg)
    if k is None:
        return not_placed(
            job, NAME, _segment_room(n, seg, sizes, [o for o, _, _ in offers], "the racks offer")
        )
    assert k > 1  # one rack would have been found in step 1
    how = "best fit"
    picks = _best_fit(sorted(offers, key=lambda x: (x[0], x[1])), sizes, k)
    if picks is None:
        picks, how = _fill(offers[:k], sizes), "most room"
    assert picks is not None  # the first k offers hold the segments (step 3)
    why = f"{n} nodes in segments of {seg} over the fewest racks ({k}) that hold them"
    if how != "best fit":
        why += " (best fit could not, so the racks with the most room)"
    choices = [why] + [f"segment of {len(sl)} -> {r.label} ({how})" for r, sl in picks]
    return whole_node_plan(fleet, job, NAME, picks, why, choices)


def _segment_room(n: int, seg: int, sizes: list[int], room: list[int], whose: str) -> str:
    """Why segments do not fit: how many of them these racks' room (largest first)
    holds at once (full segments in order, the shorter last one in a leftover)."""
    q = n // seg
    slots = sum(r // seg for r in room)
    fits = min(q, slots)
    if len(sizes) > q and (slots > q or any(r % seg >= sizes[-1] for r in room)):
        fits += 1
    return (
        f"no set of racks holds {n} nodes in segments of {seg}: {whose} room for "
        f"{fits} of its {len(sizes)} segments"
    )


def _many_racks(
    fleet: Fleet, job: JobRequest, racks: list[Rack], n: int, ctx: Context, k_start: int
) -> PlacementPlan:
    """A gang without segments over the fewest racks: equal parts, each best fit
    (smallest offer that holds it); else unequal parts over the same racks."""
    size = fleet.group_size[racks[0].gpus_per_node]
    # Fewest racks only, unless the job may span racks (locality none, or a preferred
    # job that has waited as long as the slowdown would cost it).
    k_min = min_racks(n, size, None)
    spread_ok = job.locality != REQUIRED and may_span(job, ctx)
    k_limit = len(racks) if spread_ok else max(k_min, k_start)
    gpn = racks[0].gpus_per_node
    index = fleet if racks is fleet.groups.get(gpn) else None  # whole group: the index
    pos = fleet.group_pos if index else {r.id: i for i, r in enumerate(racks)}
    desc: list[tuple[int, int, Rack]] | None = None  # offers, largest first (lazy)
    desc_k = 0  # with the index, desc holds the top desc_k offers only
    k_top = min(k_limit, n)
    if index is not None and sum(f for f, _ in index.by_free.get(gpn, [])[-k_top:]) < n:
        k_top = 0  # even the k_top most idle racks cannot hold it: no k below can
    for k in range(max(1, k_start), k_top + 1):
        sizes = _split(n, k)
        if max(sizes) > size:
            continue
        if index is not None and sum(f for f, _ in index.by_free.get(gpn, [])[-k:]) < n:
            # Both ways below use at most k racks, and a rack offers at most its idle
            # nodes: the k racks with the most idle nodes cannot hold the gang.
            continue
        picks = _assign(index, racks, sizes, ctx, pos, k, job.preemptible, n)
        note = ""
        if picks is None and k > 1:
            # Equal parts do not fit now; unequal ones over the same number of racks
            # cost nothing more in rack count, and beat waiting.
            if index is not None:
                top_idle = index.by_free.get(gpn, [])[-k:]
                if len(top_idle) < k or sum(f for f, _ in top_idle) < n:
                    desc, desc_k = [], k  # offers are at most the idle counts: no room
                elif desc is None or desc_k < k:
                    desc, desc_k = _top_offers(index, gpn, k, ctx, n, job.preemptible), k
            elif desc is None:
                desc = sorted(
                    (
                        (_offer(r, ctx, may_borrow(r, n, job.preemptible)), pos[r.id], r)
                        for r in racks
                        if r.free_count
                    ),
                    key=lambda x: (-x[0], x[1]),
                )
            picks = _unequal(desc[:k], n, k)
            note = f" (no {k} racks hold {'+'.join(map(str, sizes))}, so unequal)"
        if picks is not None:
            n_racks = len({r.id for r, _ in picks})
            why = (
                f"{n} nodes over the fewest racks ({n_racks}) in segments "
                + "+".join(str(len(s)) for _, s in picks)
                + note
            )
            choices = [why] + [f"segment of {len(s)} -> {r.label} (best fit)" for r, s in picks]
            return whole_node_plan(fleet, job, NAME, picks, why, choices)
    if spread_ok:
        return not_placed(job, NAME, f"the racks together do not offer {n} idle nodes")
    return not_placed(
        job,
        NAME,
        f"no {k_limit} racks offer {n} idle nodes together"
        + ("; required locality, the job waits" if job.locality == REQUIRED else ""),
    )


def _top_offers(
    fleet: Fleet, gpn: int, k: int, ctx: Context, n: int, preemptible: bool
) -> list[tuple[int, int, Rack]]:
    """The ``k`` largest (offer, group position, rack) of the group's racks that have an
    idle node, largest offer first (ties: group order), read from the index: racks are
    taken by idle count, largest first, until the next one's idle count (a bound on its
    offer) is below the k-th best offer found."""
    index = fleet.by_free.get(gpn, [])
    group = fleet.groups[gpn]
    got: list[tuple[int, int, Rack]] = []
    top: list[int] = []  # min-heap of the k best offers so far
    for i in range(len(index) - 1, -1, -1):
        free, p = index[i]
        if len(top) == k and free < top[0]:
            break
        r = group[p]
        o = _offer(r, ctx, may_borrow(r, n, preemptible))
        got.append((o, p, r))
        heapq.heappush(top, o)
        if len(top) > k:
            heapq.heappop(top)
    got.sort(key=lambda x: (-x[0], x[1]))
    return got[:k]


def _assign(
    fleet: Fleet | None,
    racks: list[Rack],
    sizes: list[int],
    ctx: Context,
    pos: dict[str, int],
    k: int,
    preemptible: bool,
    n: int,
) -> list[tuple[Rack, list[int]]] | None:
    """Best-fit each part (largest first) onto a rack, at most ``k`` racks. A rack
    lends its spares by the largest part, the most it must hold (:func:`may_borrow`).
    With ``fleet`` (``racks`` is its whole shape group) the racks with room come from
    its index."""
    smallest = min(sizes)
    offers: list[tuple[int, int, Rack]] = []
    biggest = max(sizes)
    if fleet is not None:
        cands: Iterable[Rack] = (r for _, _, r in fleet.racks_with_idle(racks[0].gpus_per_node, smallest))
    else:
        cands = racks
    for r in cands:
        if r.free_count < smallest:
            continue
        o = _offer(r, ctx, may_borrow(r, n, preemptible, biggest))
        if o >= smallest:
            offers.append((o, pos[r.id], r))
    if sum(o for o, _, _ in offers) < sum(sizes):
        return None
    offers.sort(key=lambda x: (x[0], x[1]))
    return _best_fit(offers, sizes, k)


def _best_fit(
    offers: list[tuple[int, int, Rack]], sizes: list[int], k: int
) -> list[tuple[Rack, list[int]]] | None:
    """Each part (largest first) onto a rack, at most ``k`` racks: the rack already
    used with the least room left that holds it, else a new rack, the one with the
    smallest offer that holds it (``offers`` sorted by offer, then group position;
    bisect)."""
    keys = [o for o, _, _ in offers]
    left: dict[str, int] = {}
    used: dict[str, tuple[int, Rack]] = {}
    slots: dict[str, list[int]] = {}
    picks: list[tuple[Rack, list[int]]] = []
    for size in sorted(sizes, reverse=True):
        rid = min((r for r in left if left[r] >= size), key=lambda r: (left[r], used[r][0]), default=None)
        if rid is None:
            if len(used) >= k:
                return None
            i = bisect.bisect_left(keys, size)
            while i < len(offers) and offers[i][2].id in used:
                i += 1
            if i == len(offers):
                return None
            o, p, rack = offers[i]
            rid = rack.id
            used[rid], left[rid], slots[rid] = (p, rack), o, rack.idle_slots()
        picks.append((used[rid][1], slots[rid][:size]))
        slots[rid] = slots[rid][size:]
        left[rid] -= size
    return picks


def _fill(offers: list[tuple[int, int, Rack]], sizes: list[int]) -> list[tuple[Rack, list[int]]] | None:
    """Segments, largest first, each onto the first of ``offers`` (largest first) with
    room left for it."""
    left = [o for o, _, _ in offers]
    slots = [r.idle_slots() for _, _, r in offers]
    picks: list[tuple[Rack, list[int]]] = []
    for size in sorted(sizes, reverse=True):
        i = next((i for i, o in enumerate(left) if o >= size), None)
        if i is None:
            return None
        picks.append((offers[i][2], slots[i][:size]))
        slots[i] = slots[i][size:]
        left[i] -= size
    return picks


def _unequal(offers: list[tuple[int, int, Rack]], n: int, k: int) -> list[tuple[Rack, list[int]]] | None:
    """The ``k`` racks with the largest offers, filled as evenly as they allow."""
    if len(offers) < k or sum(o for o, _, _ in offers) < n:
        return None
    # Water-fill: the smallest racks take what they can, the rest share evenly.
    take = [0] * k
    left = n
    for done, (i, (o, _, _)) in enumerate(sorted(enumerate(offers), key=lambda x: x[1][0])):
        take[i] = min(o, -(-left // (k - done)))
        left -= take[i]
    if left > 0:
        return None
    return [(r, r.idle_slots()[:t]) for (_, _, r), t in zip(offers, take, strict=True) if t]


def _small(fleet: Fleet, job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    g = job.num_gpus
    gpn = racks[0].gpus_per_node
    whole = racks is fleet.groups.get(gpn)  # the whole group: read the indexes
    view: dict[str, Rack] = {}
    if whole:
        pos = fleet.group_pos
    else:
        pos = {r.id: i for i, r in enumerate(racks)}
        view = {r.id: r for r in racks}
    best: tuple[tuple[int, int, int, int], Node] | None = None
    # 1. Partly used nodes: tightest fit first, busiest rack next.
    for free in range(g, gpn):
        for nid in fleet.partial.get(free, ()):
            node = fleet.nodes[nid]
            rack = fleet.rack_by_id[node.rack]
            if whole:
                if rack.gpus_per_node != gpn:
                    continue  # a rack of another shape group
            else:
                # A filtered list, or a backfill view that leaves some nodes out.
                v = view.get(rack.id)
                if v is None:
                    continue
                allowed = getattr(v, "node_ids", None)
                if allowed is not None and nid not in allowed:
                    continue
                rack = v
            key = (free, rack.free_count, pos[rack.id], node.index)
            if best is None or key < best[0]:
                best = (key, node)
        if best is not None:
            node = best[1]
            return small_plan(
                job, NAME, node, f"best fit on partly used node {node.label} ({free} free GPUs)"
            )
    # 2. An idle node in the busiest rack that still has one.
    brack: tuple[int, int, Rack] | None = None
    if whole:
        for idle, p, rack in fleet.racks_with_idle(gpn):
            if rack.id not in ctx.reserved:
                brack = (idle, p, rack)
                break
    else:
        for p, rack in enumerate(racks):
            if rack.free and rack.id not in ctx.reserved:
                rkey = (rack.free_count, p)
                if brack is None or rkey < brack[:2]:
                    brack = (rack.free_count, p, rack)
    if brack is None:
        return not_placed(job, NAME, f"no node has {g} free GPUs")
    rack = brack[2]
    node = fleet.node_at(rack.id, min(rack.free))
    return small_plan(
        job,
        NAME,
        node,
        f"idle node {node.label} in the busiest rack with room "
        f"({rack.label}, {rack.free_count} idle), keeping "
        "emptier racks whole",
    )


def nodes_for(job: JobRequest, gpn: int) -> int:
    return job.nodes_needed(gpn) if not job.is_small(gpn) else 1


def rack_room(job: JobRequest, racks: list[Rack]) -> Callable[[dict[str, int]], bool]:
    """A test: could :func:`rackwise` place the gang if rack r had ``avail[r]`` idle
    nodes? A necessary condition (spares are not counted against it), which backfill
    uses to skip future times cheaply."""
    gpn = racks[0].gpus_per_node
    n = job.nodes_needed(gpn)
    size = max(r.size for r in racks)
    seg = segment_of(job.segment_nodes, n)
    ids = [r.id for r in racks]
    if seg and seg < n:
        # Segments over any racks (step 5): the racks with the most room, as many as
        # there are segments, must hold them.
        m = -(-n // seg)

        def in_segments(avail: dict[str, int]) -> bool:
            return fewest_racks(heapq.nlargest(m, (avail[r] for r in ids)), n, seg) is not None

        in_segments.blocks = [(ids, n, seg)]  # type: ignore[attr-defined]
        return in_segments
    k = min_racks(n, size, seg)

    def test(avail: dict[str, int]) -> bool:
        if k == 1:
            return any(avail[r] >= n for r in ids)
        return sum(heapq.nlargest(k, (avail[r] for r in ids))) >= n

    # The same as blocks (a weaker test for k > 1: all racks together), for
    # Backfill to find the first time worth trying.
    test.blocks = [([r], n, seg) for r in ids] if k == 1 else [(ids, n, seg)]  # type: ignore[attr-defined]
    return test
