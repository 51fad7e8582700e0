"""An exhaustive oracle for the ``rackwise`` policy, for tests on small fleets.

It lists every assignment of one job to the fleet that rackwise's rules allow and
says whether there is one, and how few racks it can use. The rules are written out
below from the policy's documentation, not from its code: nothing here calls the
engine's helpers (no ``min_racks``, ``segment_sizes``, ``Rack.slice_offer``, no
index), and capacity is recounted from the nodes and the allocation records, so a
test can catch a placement the engine misses. It enumerates, so keep fleets small
(a few racks of a few nodes).

The rules (``placement/policies/rackwise.py``, ``placement/README.md``):

1. **Capacity.** A single-node job (no ``num_nodes``, at most one node's GPUs) needs
   one healthy node with that many free GPUs; an idle node of a reserved rack is
   not for it. A gang takes whole idle nodes (healthy, no GPU held) of one shape
   group (racks whose nodes have the same GPU count), none in a reserved rack.
   Excluded racks are not used at all; reservations are ignored for a job expected
   to end before ``reserved_until``.
2. **Spares.** A rack keeps ``spare_nodes`` idle nodes back, less the nodes it has
   lent already (nodes hosting only small or preemptible jobs). It offers them to a
   gang too (lends them) when the gang is preemptible, when the whole gang is at
   most ``spare_nodes`` nodes, or when the part of the gang that must sit whole in
   one rack (its segment; the whole gang without segments) is bigger than the
   rack's slice (its nodes less ``spare_nodes``).
3. **Segments.** With ``segment_nodes`` s below the gang's n nodes the gang is
   floor(n / s) segments of s nodes and one of n mod s; each segment lies whole in
   one rack, a rack may hold several, and any number of racks may be used, whatever
   the locality (``required`` means each segment inside one rack, as Slurm's
   ``--segment``). With s >= n the gang is one segment: one rack.
4. **No segments.** Any split over racks. A gang that fits the group's largest rack
   (excluded racks count: they are left out of this decision, not out of the
   fleet's shape) uses one rack; one that does not uses ceil(n / largest rack)
   racks at most. It
   may use more only when its locality is not ``required`` and it may span: no
   clock, or it has waited ``SPAN_PATIENCE`` times what the slowdown would cost it.
5. **Preference** (what the tests hold the engine to): the fewest racks of any valid
   assignment, over every shape group.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from placement.model import HEALTHY, REQUIRED, Fleet, JobRequest, Rack
from placement.plans import PlacementPlan
from placement.policies.rackwise import CROSS_RACK_SLOWDOWN, SPAN_PATIENCE


@dataclass
class RackRoom:
    """One rack as a gang sees it under the rules: its idle nodes and its offer."""

    rack: Rack
    idle: list[int]  # slots of healthy nodes with no GPU held
    offer: int  # idle nodes it offers this gang (rule 2; 0 when reserved)


@dataclass
class GroupAnswer:
    gpus_per_node: int
    nodes: int  # nodes the gang needs in this group (0: small job)
    pieces: list[int]  # the segments, largest first (one piece: the whole gang, or split freely)
    split_freely: bool  # no segments: any split over racks (rule 4)
    max_racks: int  # the most racks it may use here
    racks: list[RackRoom] = field(default_factory=list)
    assignments: int = 0  # valid assignments found
    fewest_racks: int | None = None


@dataclass
class Answer:
    """``feasible``: some assignment is valid; ``fewest_racks``: the fewest racks of
    any valid one (1 for a single-node job); ``groups``: the figures per shape."""

    feasible: bool
    fewest_racks: int | None
    groups: list[GroupAnswer]


def solve(
    fleet: Fleet,
    job: JobRequest,
    *,
    reserved: Iterable[str] = (),
    reserved_until: float | None = None,
    exclude: Iterable[str] = (),
    now: float | None = None,
) -> Answer:
    """Every assignment of ``job`` that the rules allow (the same arguments as
    :func:`placement.place.place`)."""
    reserved_set = _reserved(job, reserved, reserved_until, now)
    skip = set(exclude)
    held, lent = _recount(fleet)
    groups: list[GroupAnswer] = []
    best: int | None = None
    feasible = False
    for gpn in sorted({r.nodes[0].gpus for r in fleet.racks if r.nodes}):
        shape = [r for r in fleet.racks if r.nodes and r.nodes[0].gpus == gpn]
        racks = [r for r in shape if r.id not in skip]
        if not racks:
            continue
        if _small(job, gpn):
            ok = any(
                n.health == HEALTHY
                and n.gpus - len(held.get(n.id, ())) >= job.num_gpus
                and not (r.id in reserved_set and not held.get(n.id))
                for r in racks
                for n in r.nodes
            )
            groups.append(
                GroupAnswer(gpn, 0, [], False, 1, assignments=int(ok), fewest_racks=1 if ok else None)
            )
        else:
            g = _gang_group(
                job, gpn, racks, held, lent, reserved_set, now, largest=max(len(r.nodes) for r in shape)
            )
            if g is None:
                continue
            groups.append(g)
        got = groups[-1].fewest_racks
        if got is not None:
            feasible = True
            best = got if best is None else min(best, got)
    return Answer(feasible, best, groups)


def check_plan(
    fleet: Fleet,
    job: JobRequest,
    plan: PlacementPlan,
    *,
    reserved: Iterable[str] = (),
    reserved_until: float | None = None,
    exclude: Iterable[str] = (),
    now: float | None = None,
) -> list[str]:
    """The rules a placed plan breaks (empty: it is one of the valid assignments)."""
    if not plan.placed:
        return ["not placed"]
    reserved_set = _reserved(job, reserved, reserved_until, now)
    held, lent = _recount(fleet)
    out: list[str] = []
    nodes = [fleet.nodes[nid] for nid in plan.nodes]
    shapes = {n.gpus for n in nodes}
    if len(shapes) != 1:
        return [f"nodes of several shapes {sorted(shapes)}"]
    gpn = shapes.pop()
    if any(fleet.rack_of(n.id).id in set(exclude) for n in nodes):
        out.append("uses an excluded rack")
    if _small(job, gpn):
        node = nodes[0]
        free = node.gpus - len(held.get(node.id, ()))
        if len(nodes) != 1 or node.health != HEALTHY or free < job.num_gpus:
            out.append("a small job needs one healthy node with room")
        if node.rack in reserved_set and not held.get(node.id):
            out.append(f"idle node {node.id} of reserved rack {node.rack}")
        return out
    shape = [r for r in fleet.racks if r.nodes and r.nodes[0].gpus == gpn]
    racks = [r for r in shape if r.id not in set(exclude)]
    g = _gang_group(
        job,
        gpn,
        racks,
        held,
        lent,
        reserved_set,
        now,
        enumerate_all=False,
        largest=max(len(r.nodes) for r in shape),
    )
    if g is None:
        return ["the job cannot use this shape"]
    room = {rr.rack.id: rr for rr in g.racks}
    if len(nodes) != g.nodes:
        out.append(f"{len(nodes)} nodes, {g.nodes} needed")
    per_rack: dict[str, int] = {}
    for n in nodes:
        rr = room.get(n.rack)
        if rr is None or n.index not in rr.idle:
            out.append(f"{n.id} is not an idle node it may use")
        per_rack[n.rack] = per_rack.get(n.rack, 0) + 1
    for rid, count in per_rack.items():
        if count > room[rid].offer:
            out.append(f"{count} nodes in {rid}, which offers {room[rid].offer}")
    if len(per_rack) > g.max_racks:
        out.append(f"{len(per_rack)} racks, at most {g.max_racks} allowed")
    if not g.split_freely:
        sizes = sorted((len(s) for s in plan.segments), reverse=True)
        if sizes != g.pieces:
            out.append(f"segments {sizes}, the job's are {g.pieces}")
        for s in plan.segments:
            if len({fleet.nodes[nid].rack for nid in s}) != 1:
                out.append(f"segment {s} spans racks")
    return out


def largest_free(fleet: Fleet, job: JobRequest) -> tuple[int, str]:
    """The what-if's figure, recounted: for a single-node job the most free GPUs on
    one healthy node; for a gang in segments (s below n) the nodes the racks offer
    in whole segments of s, all racks together; for any other gang the largest
    offer of one rack."""
    held, lent = _recount(fleet)
    best, unit = 0, "nodes"
    for gpn in sorted({r.nodes[0].gpus for r in fleet.racks if r.nodes}):
        racks = [r for r in fleet.racks if r.nodes and r.nodes[0].gpus == gpn]
        if _small(job, gpn):
            unit = "GPUs"
            best = max(
                [best]
                + [n.gpus - len(held.get(n.id, ())) for r in racks for n in r.nodes if n.health == HEALTHY]
            )
            continue
        g = _gang_group(job, gpn, racks, held, lent, set(), None, enumerate_all=False)
        if g is None:
            continue
        if g.split_freely or len(g.pieces) == 1:
            best = max([best] + [rr.offer for rr in g.racks])
        else:
            seg = g.pieces[0]
            best = max(best, sum(rr.offer // seg * seg for rr in g.racks))
    return best, unit


def segments_room(
    fleet: Fleet, job: JobRequest, gpn: int, *, reserved: Iterable[str] = (), idle_only: bool = False
) -> tuple[int, int]:
    """(the most of the gang's segments the racks of this shape hold at once, how
    many segments it has), counting each rack's offer (``idle_only``: its idle
    nodes, spares included). By enumeration."""
    held, lent = _recount(fleet)
    racks = [r for r in fleet.racks if r.nodes and r.nodes[0].gpus == gpn]
    g = _gang_group(job, gpn, racks, held, lent, set(reserved), None, enumerate_all=False)
    assert g is not None and not g.split_freely
    caps = [len(rr.idle) if idle_only else rr.offer for rr in g.racks]
    best = 0
    # Each piece goes to a rack or stays out; pieces of one size are alike, so count
    # how many of each size each rack takes.
    for take in _piece_choices(g.pieces, caps, allow_out=True):
        best = max(best, sum(1 for c in take if c is not None))
    return best, len(g.pieces)


# -- the rules --------------------------------------------------------------------------


def _small(job: JobRequest, gpn: int) -> bool:
    return job.num_nodes is None and job.num_gpus <= gpn


def _nodes(job: JobRequest, gpn: int) -> int:
    if job.num_nodes is not None:
        return job.num_nodes if (job.gpus_per_node or 0) <= gpn else 0
    return -(-job.num_gpus // gpn)


def _reserved(job: JobRequest, reserved: Iterable[str], until: float | None, now: float | None) -> set[str]:
    if (
        until is not None
        and now is not None
        and job.expected_duration is not None
        and now + job.expected_duration <= until
    ):
        return set()
    return set(reserved)


def _may_span(job: JobRequest, now: float | None) -> bool:
    if now is None or job.submit_time is None or job.expected_duration is None:
        return True
    cost = job.expected_duration * CROSS_RACK_SLOWDOWN / (1 - CROSS_RACK_SLOWDOWN)
    return now - job.submit_time >= SPAN_PATIENCE * cost


def _recount(fleet: Fleet) -> tuple[dict[str, set[int]], dict[str, int]]:
    """GPUs held per node, and nodes lent per rack, from the allocation records."""
    held: dict[str, set[int]] = {}
    jobs_on: dict[str, list[JobRequest]] = {}
    for alloc in fleet.allocations.values():
        for nid, gpus in alloc.nodes.items():
            held.setdefault(nid, set()).update(gpus)
            jobs_on.setdefault(nid, []).append(alloc.job)
    lent: dict[str, int] = {}
    for rack in fleet.racks:
        lent[rack.id] = sum(
            1
            for n in rack.nodes
            if jobs_on.get(n.id) and all(j.preemptible or _small(j, n.gpus) for j in jobs_on[n.id])
        )
    return held, lent


def _gang_group(
    job: JobRequest,
    gpn: int,
    racks: list[Rack],
    held: dict[str, set[int]],
    lent: dict[str, int],
    reserved: set[str],
    now: float | None,
    enumerate_all: bool = True,
    largest: int | None = None,
) -> GroupAnswer | None:
    n = _nodes(job, gpn)
    if n == 0 or not racks:
        return None
    largest = largest or max(len(r.nodes) for r in racks)
    s = job.segment_nodes
    if s is not None and s < n:
        pieces = [s] * (n // s) + ([n % s] if n % s else [])
        whole, free_split, max_racks = s, False, len(pieces)
    elif s is not None:
        pieces, whole, free_split, max_racks = [n], n, False, 1
    else:
        pieces, whole, free_split = [n], n, True
        fewest = -(-n // largest)
        spread = job.locality != REQUIRED and _may_span(job, now)
        max_racks = max(1, n if spread else fewest)
    rooms: list[RackRoom] = []
    for r in racks:
        idle = [nd.index for nd in r.nodes if nd.health == HEALTHY and not held.get(nd.id)]
        lends = job.preemptible or n <= r.spare_nodes or whole > len(r.nodes) - r.spare_nodes
        keep = 0 if lends else max(0, r.spare_nodes - lent[r.id])
        offer = 0 if r.id in reserved else max(0, len(idle) - keep)
        rooms.append(RackRoom(r, idle, offer))
    g = GroupAnswer(gpn, n, pieces, free_split, max_racks, rooms)
    if not enumerate_all:
        return g
    caps = [rr.offer for rr in rooms]
    if free_split:
        for split in _splits(n, caps):
            used = sum(1 for x in split if x)
            if used <= max_racks:
                g.assignments += 1
                g.fewest_racks = used if g.fewest_racks is None else min(g.fewest_racks, used)
    else:
        for take in _piece_choices(pieces, caps, allow_out=False):
            used = len(set(take))
            if used <= max_racks:
                g.assignments += 1
                g.fewest_racks = used if g.fewest_racks is None else min(g.fewest_racks, used)
    return g


def _splits(n: int, caps: list[int]) -> Iterator[tuple[int, ...]]:
    """Every way to take ``n`` nodes, at most caps[i] from rack i."""
    if not caps:
        if n == 0:
            yield ()
        return
    rest_cap = sum(caps[1:])
    for x in range(max(0, n - rest_cap), min(n, caps[0]) + 1):
        for tail in _splits(n - x, caps[1:]):
            yield (x, *tail)


def _piece_choices(pieces: list[int], caps: list[int], allow_out: bool) -> Iterator[tuple[int | None, ...]]:
    """Every way to put each piece in a rack (its index; None: left out, with
    ``allow_out``) within the racks' caps. Pieces of equal size are alike: they
    take racks in non-decreasing order, so each distribution is listed once."""
    choices: list[int | None] = list(range(len(caps))) + ([None] if allow_out else [])

    def rec(i: int, left: list[int], prev: tuple[int, int | None]) -> Iterator[tuple[int | None, ...]]:
        if i == len(pieces):
            yield ()
            return
        size = pieces[i]
        for c in choices:
            # Same size as the previous piece: not before the rack it took (None last).
            if prev[0] == size and _order(c) < _order(prev[1]):
                continue
            if c is not None and left[c] < size:
                continue
            if c is not None:
                left[c] -= size
            for tail in rec(i + 1, left, (size, c)):
                yield (c, *tail)
            if c is not None:
                left[c] += size

    yield from rec(0, list(caps), (0, None))


def _order(c: int | None) -> float:
    return float("inf") if c is None else c


def all_assignments(fleet: Fleet, job: JobRequest, **kw: object) -> int:
    """How many valid assignments there are (for tests that want the count)."""
    answer = solve(fleet, job, **kw)  # type: ignore[arg-type]
    return sum(g.assignments for g in answer.groups)


__all__ = [
    "Answer",
    "GroupAnswer",
    "RackRoom",
    "all_assignments",
    "check_plan",
    "largest_free",
    "segments_room",
    "solve",
]
