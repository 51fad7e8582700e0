"""Small builders for tests and what-if scripts (used by tests/placement)."""

from __future__ import annotations

from placement.model import Allocation, Fleet, JobRequest


def gang(jid: str, nodes: int, locality: str = "preferred", **kw: object) -> JobRequest:
    return JobRequest(jid, num_gpus=nodes * 4, locality=locality, **kw)  # type: ignore[arg-type]


def occupy(fleet: Fleet, jid: str, rack: int, slots: list[int], **kw: object) -> Allocation:
    """Put a whole-node job on the given slots of rack number ``rack``."""
    r = fleet.racks[rack]
    nodes = {fleet.node_at(r.id, i).id: tuple(range(r.gpus_per_node)) for i in slots}
    job = JobRequest(jid, num_gpus=len(slots) * r.gpus_per_node, **kw)  # type: ignore[arg-type]
    alloc = Allocation(job, nodes, [list(nodes)])
    fleet.allocate(alloc)
    return alloc
