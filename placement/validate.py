"""The invariant checker, used by the property tests and before applying any plan.

Checks, from scratch (it does not trust the Fleet's indexes):
no GPU held twice; no job on a failed node; a gang holds whole nodes and exactly the
nodes it needs; a small job sits on one node; required locality is honoured (no more
racks than the fewest that could hold the job; for a job in segments, each segment
inside one rack); every segment lies inside one rack and the segments cover the
allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from placement.model import FAILED, REQUIRED, Allocation, Fleet, JobRequest
from placement.plans import PlacementPlan, RecoveryPlan
from placement.policies.common import min_racks


@dataclass(frozen=True)
class Violation:
    job_id: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.job_id}: {self.rule}: {self.detail}"


class InvariantError(AssertionError):
    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(str(v) for v in violations))
        self.violations = violations


def validate(
    fleet: Fleet,
    allocations: Mapping[str, Allocation] | PlacementPlan | None = None,
    *,
    raise_on_error: bool = False,
    job: object = None,
    topology: bool = True,
) -> list[Violation]:
    """Return every violated invariant (empty list: all good).

    ``allocations`` defaults to the fleet's own. Pass a PlacementPlan (with ``job``,
    the JobRequest) to check it against the fleet as it stands before applying it.
    With ``raise_on_error`` an InvariantError is raised instead of returning.
    ``topology=False`` skips the locality and segment rules (for topology-blind
    policies, which cannot know them).
    """
    if isinstance(allocations, PlacementPlan):
        if not isinstance(job, JobRequest):
            raise TypeError("validating a PlacementPlan needs job=JobRequest")
        allocs: dict[str, Allocation] = dict(fleet.allocations)
        if allocations.placed:
            allocs[job.id] = allocations.allocation(job)
        out = _check(fleet, allocs, topology)
    else:
        out = _check(fleet, fleet.allocations if allocations is None else allocations, topology)
    if out and raise_on_error:
        raise InvariantError(out)
    return out


def validate_indexes(fleet: Fleet) -> list[Violation]:
    """Check the Fleet's incremental indexes against a recount from the nodes
    (idle sets, lent-node counts, the partly-used-node index, racks by idle count,
    GPU masks)."""
    out: list[Violation] = []
    for rack in fleet.racks:
        idle = {n.index for n in rack.nodes if n.health == "healthy" and not n.jobs}
        if rack.free != idle:
            out.append(Violation("-", "index", f"{rack.id}: idle set {sorted(rack.free)} != {sorted(idle)}"))
        lent = sum(
            1
            for n in rack.nodes
            if n.jobs
            and all(
                fleet.allocations[j].job.preemptible or fleet.allocations[j].job.is_small(n.gpus)
                for j in n.jobs
            )
        )
        if rack.lent_nodes != lent:
            out.append(Violation("-", "index", f"{rack.id}: lent {rack.lent_nodes} != {lent}"))
    idle_total = sum(len(r.free) for r in fleet.racks)
    if fleet.idle_total != idle_total:
        out.append(Violation("-", "index", f"idle total {fleet.idle_total} != {idle_total}"))
    for gpn, racks in fleet.groups.items():
        want_index = sorted((len(r.free), i) for i, r in enumerate(racks) if r.free)
        if fleet.by_free.get(gpn) != want_index:
            out.append(Violation("-", "index", f"{gpn}-GPU racks by idle count out of date"))
    for node in fleet.nodes.values():
        mask = 0
        for jid, m in node.jobs.items():
            alloc = fleet.allocations.get(jid)
            if alloc is None or node.id not in alloc.nodes:
                out.append(Violation(jid, "index", f"{node.id} lists a job not on it"))
            mask |= m
        if mask != node.used:
            out.append(Violation("-", "index", f"{node.id}: used mask out of date"))
        free = node.gpus - node.used.bit_count()
        want = free if node.health == "healthy" and node.used and free else 0
        listed = [f for f, ids in fleet.partial.items() if node.id in ids]
        if listed != ([want] if want else []):
            out.append(Violation("-", "index", f"{node.id}: partial index {listed}, expected {want}"))
    return out


def validate_recovery(fleet: Fleet, plan: RecoveryPlan) -> list[Violation]:
    """Check the recovered job's allocation as the plan would leave it (its victims
    are released; no other job changes). Other jobs may still sit on failed nodes,
    awaiting their own recovery: they are not this plan's violations."""
    from placement.recover import apply_recovery  # recover imports place, which validates with this module

    with fleet.trial():
        alloc = apply_recovery(fleet, plan)
        return _check(fleet, {plan.job_id: alloc} if alloc is not None else {})


def _check(fleet: Fleet, allocations: Mapping[str, Allocation], topology: bool = True) -> list[Violation]:
    out: list[Violation] = []
    held: dict[tuple[str, int], str] = {}
    for jid, alloc in allocations.items():
        job = alloc.job
        if not alloc.nodes:
            out.append(Violation(jid, "empty", "allocation holds no node"))
            continue
        for nid, gpus in alloc.nodes.items():
            node = fleet.nodes.get(nid)
            if node is None:
                out.append(Violation(jid, "unknown-node", nid))
                continue
            if node.health == FAILED:
                out.append(Violation(jid, "failed-node", f"runs on failed node {nid}"))
            if len(set(gpus)) != len(gpus):
                out.append(Violation(jid, "double-gpu", f"lists a GPU twice on {nid}"))
            for g in gpus:
                if not 0 <= g < node.gpus:
                    out.append(Violation(jid, "bad-gpu", f"GPU {g} on {nid}"))
                other = held.get((nid, g))
                if other is not None:
                    out.append(Violation(jid, "double-gpu", f"GPU {nid}/{g} also held by {other}"))
                held[(nid, g)] = jid
        known = [fleet.nodes[n] for n in alloc.nodes if n in fleet.nodes]
        if not known:
            continue
        gpn = known[0].gpus
        if job.is_small(gpn):
            if len(alloc.nodes) != 1 or alloc.gpus != job.num_gpus:
                out.append(
                    Violation(
                        jid,
                        "small-job",
                        f"{job.num_gpus} GPUs wanted, got {alloc.gpus} on {len(alloc.nodes)} nodes",
                    )
                )
            continue
        need = job.nodes_needed(gpn)
        if len(alloc.nodes) != need:
            out.append(Violation(jid, "gang", f"needs {need} nodes, holds {len(alloc.nodes)}"))
        for node in known:
            if len(alloc.nodes[node.id]) != node.gpus:
                out.append(Violation(jid, "gang", f"holds part of node {node.id}"))
        if not topology:
            continue
        segs = alloc.segments or [list(alloc.nodes)]
        covered = [n for s in segs for n in s]
        if sorted(covered) != sorted(alloc.nodes):
            out.append(Violation(jid, "segments", "segments do not cover the allocation"))
        for seg in segs:
            racks = {fleet.nodes[n].rack for n in seg if n in fleet.nodes}
            if len(racks) > 1:
                out.append(Violation(jid, "segment-span", f"segment spans racks {sorted(racks)}"))
            if job.segment_nodes and len(seg) > job.segment_nodes:
                out.append(
                    Violation(jid, "segment-size", f"segment of {len(seg)} nodes > {job.segment_nodes}")
                )
        if job.locality == REQUIRED and not (job.segment_nodes and job.segment_nodes < need):
            # (A job in segments asked for each segment inside one rack, checked above,
            # as Slurm's --segment: its segments may take several racks.)
            racks_used = {n.rack for n in known}
            size = max(fleet.rack_by_id[r].size for r in racks_used)
            if len(racks_used) > min_racks(need, size, job.segment_nodes):
                out.append(
                    Violation(
                        jid,
                        "locality",
                        f"required locality: {len(racks_used)} racks used, fewer would hold it",
                    )
                )
    return out
