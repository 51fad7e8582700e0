"""Rack-level fragmentation: free GPUs the typical job shapes cannot use where they are.

This is the FGD idea ("Beware of Fragmentation", ATC'23) moved from "GPU on a node"
to "node in a rack": for each typical shape, the free GPUs of a rack that the shape
cannot use are counted, and the counts are averaged with the shape frequencies.

* A shape of at most one node's GPUs (G) cannot use ``free mod G`` GPUs of a node.
* A gang of ``n`` nodes uses whole idle nodes in units of ``u`` (the gang itself if
  it fits in a rack, else its segment, by default the equal split over the fewest
  racks): ``idle mod u`` idle nodes are stranded, and so are all the free GPUs on
  partly used nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.model import Fleet, JobRequest, Rack
from placement.policies.common import min_racks

# GPUs -> weight. A mix from single GPUs to two-rack gangs, used when no queue or
# history is given (the simulator passes the shapes it has seen).
DEFAULT_SHAPES: dict[int, float] = {
    1: 0.15, 2: 0.1, 4: 0.15, 8: 0.15, 16: 0.15, 32: 0.12, 64: 0.12, 128: 0.06,
}


@dataclass
class RackFragmentation:
    rack: str
    free_gpus: int
    idle_nodes: int
    fragmented_gpus: float
    largest_job_gpus: int

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "free_gpus": self.free_gpus, "idle_nodes": self.idle_nodes,
                "fragmented_gpus": round(self.fragmented_gpus, 6),
                "largest_job_gpus": self.largest_job_gpus}


@dataclass
class FragmentationReport:
    """Fleet-wide and per-rack figures. ``fraction`` = fragmented / free GPUs."""

    free_gpus: int
    fragmented_gpus: float
    fraction: float
    largest_job_gpus: int
    shapes: dict[str, float]
    racks: list[RackFragmentation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"free_gpus": self.free_gpus, "fragmented_gpus": round(self.fragmented_gpus, 6),
                "fraction": round(self.fraction, 6), "largest_job_gpus": self.largest_job_gpus,
                "shapes": self.shapes, "racks": [r.to_dict() for r in self.racks]}


Shape = tuple[int, int | None]  # (GPUs, segment nodes)


def _normalise(
    shapes: Mapping[int, float] | Sequence[JobRequest] | None,
) -> dict[Shape, float]:
    if shapes is None:
        shapes = DEFAULT_SHAPES
    out: dict[Shape, float] = {}
    if isinstance(shapes, Mapping):
        for g, w in shapes.items():
            out[(int(g), None)] = out.get((int(g), None), 0.0) + float(w)
    else:
        for job in shapes:
            key = (job.total_gpus, job.segment_nodes)
            out[key] = out.get(key, 0.0) + 1.0
    total = sum(out.values()) or 1.0
    return {k: v / total for k, v in out.items() if v > 0}


def rack_fragmentation(rack: Rack, shapes: dict[Shape, float],
                       partial: list[int] | None = None) -> tuple[float, int, int]:
    """(fragmented GPUs, free GPUs, largest rack-local job in GPUs) for one rack.
    ``partial``: the free GPUs of its partly used nodes, if known (any order)."""
    g = rack.gpus_per_node
    idle = len(rack.free)
    if partial is None:
        partial = [n.free_gpus for n in rack.nodes if n.used and n.free_gpus]
    free = idle * g + sum(partial)
    frag = 0.0
    for (gpus, seg), w in shapes.items():
        if gpus <= g:
            lost = sum(f % gpus for f in partial) + idle * (g % gpus)
        else:
            n = -(-gpus // g)
            if n <= rack.size and (not seg or seg >= n):
                unit = n
            elif seg:
                unit = seg
            else:
                unit = -(-n // min_racks(n, rack.size, None))
            lost = (idle % unit if unit <= rack.size else idle) * g + sum(partial)
        frag += w * lost
    largest = max([idle * g, *partial])
    return frag, free, largest


def fragmentation(
    fleet: Fleet, shapes: Mapping[int, float] | Sequence[JobRequest] | None = None
) -> FragmentationReport:
    """Fragmentation of the fleet for ``shapes`` (GPUs -> weight, or a list of jobs such
    as the pending queue or recent history; default :data:`DEFAULT_SHAPES`)."""
    norm = _normalise(shapes)
    # Partly used nodes by rack, from the fleet's index rather than every node.
    partial: dict[str, list[int]] = {}
    for free, ids in fleet.partial.items():
        for nid in ids:
            partial.setdefault(fleet.nodes[nid].rack, []).append(free)
    per: list[RackFragmentation] = []
    total_frag = 0.0
    total_free = 0
    largest = 0
    for rack in fleet.racks:
        frag, free, big = rack_fragmentation(rack, norm, partial.get(rack.id, []))
        per.append(RackFragmentation(rack.id, free, len(rack.free), frag, big))
        total_frag += frag
        total_free += free
        largest = max(largest, big)
    return FragmentationReport(
        free_gpus=total_free,
        fragmented_gpus=total_frag,
        fraction=total_frag / total_free if total_free else 0.0,
        largest_job_gpus=largest,
        shapes={f"{g}" + (f"/seg{s}" if s else ""): round(w, 6) for (g, s), w in norm.items()},
        racks=per,
    )
