"""Helpers shared by the placement policies."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from placement.model import Fleet, JobRequest, Node, Rack
from placement.plans import PlacementPlan


@dataclass
class Context:
    """Per-decision options.

    ``reserved``: racks whose idle nodes are held for a blocked job (queue look-ahead);
    ``now``: the clock, used by rackwise to decide when a preferred job may span
    racks (None: decide as if the job had waited long enough); ``rng``: the random
    source of the policies that draw (None: ``Random(seed)``, made at the first
    draw, :meth:`random`; seeding one costs more than most decisions).
    """

    rng: random.Random | None = None
    reserved: frozenset[str] = frozenset()
    now: float | None = None
    seed: int = 0

    def random(self) -> random.Random:
        if self.rng is None:
            self.rng = random.Random(self.seed)
        return self.rng


def min_racks(nodes: int, rack_size: int, segment: int | None) -> int:
    """Fewest racks of ``rack_size`` nodes that hold ``nodes``, segments kept whole
    (:func:`segment_sizes`; a segment larger than the job is the job). 0: a segment
    is larger than a rack."""
    seg = segment_of(segment, nodes)
    if seg:
        if seg > rack_size:
            return 0
        return fewest_racks(itertools.repeat(rack_size, nodes), nodes, seg) or 0
    return max(1, math.ceil(nodes / rack_size))


def segment_of(segment: int | None, nodes: int) -> int | None:
    """The segment a gang of ``nodes`` nodes really has: at most the gang (a segment
    longer than the job is the whole job); None without segments."""
    return min(segment, nodes) if segment else None


def segment_sizes(nodes: int, segment: int) -> list[int]:
    """Split into segments of ``segment`` nodes; a remainder forms a last, smaller one."""
    sizes = [segment] * (nodes // segment)
    if nodes % segment:
        sizes.append(nodes % segment)
    return sizes


def fewest_racks(room: Iterable[int], nodes: int, segment: int | None) -> int | None:
    """How many of these racks, taken in the order given (largest ``room`` first),
    hold ``nodes`` nodes, in whole :func:`segment_sizes` of ``segment`` when given;
    None if all of them together cannot. Reads ``room`` only as far as it needs.

    Taken largest first, the first k racks are as good as any k: a rack with more
    room holds at least as many whole segments, and of two racks that hold the same
    number, the larger has the larger leftover for the last, shorter segment. k
    racks hold q segments of s and one of r < s when they hold q + 1 of s, or q of
    s and one of them has r nodes left over (r = 0: q of s)."""
    if segment and segment >= nodes:
        return 1 if next(iter(room), 0) >= nodes else None  # one segment: the largest rack
    if not segment:
        total = 0
        for k, r in enumerate(room, 1):
            total += r
            if total >= nodes:
                return k
        return None
    q, rest = divmod(nodes, segment)
    whole = left = 0
    for k, r in enumerate(room, 1):
        whole += r // segment
        left = max(left, r % segment)
        if whole > q or (whole == q and left >= rest):
            return k
    return None


def whole_node_plan(
    fleet: Fleet,
    job: JobRequest,
    policy: str,
    picks: list[tuple[Rack, list[int]]],
    reason: str,
    choices: list[str],
) -> PlacementPlan:
    """Plan taking every GPU of the picked nodes; one segment per (rack, slots) pick."""
    nodes: dict[str, tuple[int, ...]] = {}
    segments: list[list[str]] = []
    racks: dict[str, None] = {}
    for rack, slots in picks:
        seg: list[str] = []
        for i in slots:
            node = fleet.node_at(rack.id, i)
            nodes[node.id] = tuple(range(node.gpus))
            seg.append(node.id)
        segments.append(seg)
        racks[rack.id] = None
    return PlacementPlan(job.id, policy, True, reason, nodes, segments, list(racks), choices)


def small_plan(job: JobRequest, policy: str, node: Node, reason: str) -> PlacementPlan:
    gpus = node.free_indices(job.num_gpus)
    return PlacementPlan(job.id, policy, True, reason, {node.id: gpus}, [[node.id]], [node.rack], [reason])


def group_by_rack(fleet: Fleet, node_ids: list[str]) -> list[tuple[Rack, list[int]]]:
    """(rack, slots) pairs in first-seen rack order."""
    out: dict[str, list[int]] = {}
    for nid in node_ids:
        node = fleet.nodes[nid]
        out.setdefault(node.rack, []).append(node.index)
    return [(fleet.rack_by_id[r], s) for r, s in out.items()]


def blind_gang_plan(
    fleet: Fleet,
    job: JobRequest,
    policy: str,
    node_ids: list[str],
    why: str,
) -> PlacementPlan:
    """Wrap a topology-blind pick. The policy cannot see racks, so it cannot honour
    required locality or segments either: the plan records where the nodes landed
    (one segment per rack) and the invariant checker will flag a broken constraint."""
    picks = group_by_rack(fleet, node_ids)
    n_racks = len(picks)
    return whole_node_plan(
        fleet, job, policy, picks, f"{why} ({len(node_ids)} nodes in {n_racks} racks)", [why]
    )


def small_candidates(fleet: Fleet, racks: list[Rack], gpus: int, ctx: Context) -> list[Node]:
    """Healthy nodes of these racks with ``gpus`` free, in rack then slot order.

    Idle nodes of reserved racks are left out (they are held for a blocked gang).
    """
    out: list[Node] = []
    for rack in racks:
        reserved = rack.id in ctx.reserved
        for node in rack.nodes:
            if node.free_gpus >= gpus and not (reserved and node.used == 0):
                out.append(node)
    return out
