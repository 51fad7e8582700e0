"""Fragmentation: the share of free GPUs that the typical multi-node job cannot
use, because they sit on partly used nodes or in racks too broken up to host it.

One definition, computed here and nowhere else (the console header, the Fleet
page's chart, ``/api/fleet/fragmentation/``, ``/metrics``, defrag plans and the
simulator all call :func:`fragmentation`); ``docs/fragmentation.md`` says the
same in an operator's words.

1. **Counted GPUs** (the denominator): the free GPUs of healthy nodes, less the
   GPUs of the spare nodes each rack keeps idle for recovery
   (:meth:`Rack.unlent_spares`: none once small or preemptible jobs have borrowed
   them). Spares are held back on purpose, so they are neither usable nor
   fragmented. GPUs of failed, draining or suspect nodes are not free.
2. **The typical multi-node job**: of the jobs given that take more than one
   node, the median by GPU demand (jobs at most its size ask for at least half of
   their GPUs), with its segment size; a job of :data:`DEFAULT_TYPICAL_GPUS` when
   none is given.
3. **A rack's share** of it: the whole job if it fits in one rack's full slice
   (nodes less spares), else its segment, else an equal split over the fewest
   full slices; never more than a full slice.
4. **Fragmented GPUs** of a rack: the free GPUs of its partly used nodes (a
   multi-node job takes whole nodes), plus its whole free slice
   (:meth:`Rack.slice_offer`: idle nodes less kept spares) when the slice is
   smaller than the rack's share. A slice that holds the share counts as usable
   in full, so a fully idle fleet is 0 whatever the job's size.
5. ``fraction`` = fragmented / counted GPUs, 0 when nothing is counted: 0 on an
   idle fleet and on a full one.

The largest free slice (``largest_slice_nodes``, and ``largest_job_gpus`` in
GPUs) is the largest :meth:`Rack.slice_offer`, the same figure as the rack's own
``slice_nodes``: what the engine offers a non-preemptible gang in one rack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.model import Fleet, JobRequest, Rack

# The typical job when no multi-node job is given: one NVL72 slice (16 nodes of 4
# GPUs, the rack's 18 less its 2 spares), the shape large training jobs take.
DEFAULT_TYPICAL_GPUS = 64


@dataclass
class RackFragmentation:
    rack: str
    free_gpus: int
    idle_nodes: int
    spare_nodes: int  # idle nodes kept back for recovery (not counted)
    slice_nodes: int  # idle nodes offered to a non-preemptible gang: Rack.slice_offer()
    share_nodes: int  # nodes of the typical job this rack must hold to be of use to it
    fragmented_gpus: int
    largest_job_gpus: int  # slice_nodes in GPUs
    name: str = ""  # set by callers that know racks by name (the service)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rack": self.name or self.rack,
            "rack_id": self.rack,
            "free_gpus": self.free_gpus,
            "idle_nodes": self.idle_nodes,
            "spare_nodes": self.spare_nodes,
            "slice_nodes": self.slice_nodes,
            "share_nodes": self.share_nodes,
            "fragmented_gpus": self.fragmented_gpus,
            "largest_job_gpus": self.largest_job_gpus,
        }


@dataclass
class FragmentationReport:
    """Fleet-wide and per-rack figures (see the module's docstring).
    ``fraction`` = ``fragmented_gpus`` / ``counted_gpus``."""

    free_gpus: int
    spare_gpus: int
    counted_gpus: int
    fragmented_gpus: int
    fraction: float
    largest_slice_nodes: int
    largest_job_gpus: int
    typical_job_gpus: int
    typical_segment_nodes: int | None
    typical_from: str  # "jobs" (the median of those given) or "default"
    racks: list[RackFragmentation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "free_gpus": self.free_gpus,
            "spare_gpus": self.spare_gpus,
            "counted_gpus": self.counted_gpus,
            "fragmented_gpus": self.fragmented_gpus,
            "fraction": round(self.fraction, 6),
            "largest_slice_nodes": self.largest_slice_nodes,
            "largest_job_gpus": self.largest_job_gpus,
            "typical_job_gpus": self.typical_job_gpus,
            "typical_segment_nodes": self.typical_segment_nodes,
            "typical_from": self.typical_from,
            "racks": [r.to_dict() for r in self.racks],
        }


def typical_job(
    shapes: Mapping[int, float] | Sequence[JobRequest] | None, node_gpus: int
) -> tuple[JobRequest, str]:
    """The typical multi-node job of ``shapes`` (GPUs -> how many jobs, or the
    jobs), and where it came from ("jobs" or "default"): the median by GPU demand,
    the smallest size such that jobs at most that big ask for at least half the
    GPUs that multi-node jobs ask for. Weighted by GPUs, so that a few big gangs
    waiting behind many small ones are not outvoted by them. Multi-node: more than
    one node of ``node_gpus`` GPUs, or ``num_nodes`` above 1."""
    gangs: list[tuple[float, JobRequest]] = []
    if isinstance(shapes, Mapping):
        gangs = [
            (int(g) * float(w), JobRequest("typical", num_gpus=int(g)))
            for g, w in shapes.items()
            if int(g) > node_gpus and w > 0
        ]
    elif shapes:
        gangs = [
            (float(j.total_gpus), j)
            for j in shapes
            if (j.num_nodes or 0) > 1 or (j.num_nodes is None and j.num_gpus > node_gpus)
        ]
    gangs.sort(key=lambda wj: (wj[1].total_gpus, wj[1].segment_nodes or 0, wj[1].id))
    half = sum(w for w, _ in gangs) / 2
    seen = 0.0
    for w, job in gangs:
        seen += w
        if seen >= half:
            return job, "jobs"
    return JobRequest("typical", num_gpus=DEFAULT_TYPICAL_GPUS), "default"


def share_nodes(rack: Rack, job: JobRequest) -> int:
    """Nodes of ``job`` one rack must offer to be of use to it (step 3); a rack
    whose nodes cannot host it at all needs more than it has."""
    full = max(1, rack.size - rack.spare_nodes)
    nodes = job.nodes_needed(rack.gpus_per_node) if rack.gpus_per_node else 0
    if nodes == 0:
        return rack.size + 1
    if nodes <= full:
        return nodes
    if job.segment_nodes:
        return min(job.segment_nodes, full)
    return math.ceil(nodes / math.ceil(nodes / full))


def fragmentation(
    fleet: Fleet, shapes: Mapping[int, float] | Sequence[JobRequest] | None = None
) -> FragmentationReport:
    """Fragmentation of ``fleet`` for the typical multi-node job of ``shapes``
    (GPUs -> weight, or jobs such as the recent and pending ones; default a job of
    :data:`DEFAULT_TYPICAL_GPUS`), as the module's docstring defines it."""
    node_gpus = max(fleet.groups) if fleet.groups else 0
    job, source = typical_job(shapes, node_gpus)
    # Free GPUs of partly used nodes by rack, from the fleet's index rather than
    # every node.
    partial: dict[str, int] = {}
    for free, ids in fleet.partial.items():
        for nid in ids:
            rid = fleet.nodes[nid].rack
            partial[rid] = partial.get(rid, 0) + free
    per: list[RackFragmentation] = []
    for rack in fleet.racks:
        g = rack.gpus_per_node
        idle = rack.free_count
        slice_nodes = rack.slice_offer()
        share = share_nodes(rack, job)
        stuck = partial.get(rack.id, 0)
        frag = stuck + (slice_nodes * g if slice_nodes < share else 0)
        per.append(
            RackFragmentation(
                rack.id, idle * g + stuck, idle, idle - slice_nodes, slice_nodes, share, frag, slice_nodes * g
            )
        )
    free = sum(r.free_gpus for r in per)
    spare = sum(r.spare_nodes * fleet.rack_by_id[r.rack].gpus_per_node for r in per)
    counted = free - spare
    fragmented = sum(r.fragmented_gpus for r in per)
    best = max(per, key=lambda r: (r.largest_job_gpus, r.slice_nodes), default=None)
    return FragmentationReport(
        free_gpus=free,
        spare_gpus=spare,
        counted_gpus=counted,
        fragmented_gpus=fragmented,
        fraction=fragmented / counted if counted else 0.0,
        largest_slice_nodes=best.slice_nodes if best else 0,
        largest_job_gpus=best.largest_job_gpus if best else 0,
        typical_job_gpus=job.total_gpus,
        typical_segment_nodes=job.segment_nodes,
        typical_from=source,
        racks=per,
    )
