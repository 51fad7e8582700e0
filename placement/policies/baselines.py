"""Topology-blind baselines: ``first-fit`` and ``random``.

``first-fit`` is Slurm's linear selection without a topology plugin (nodes as a
one-dimensional array, lowest-numbered free nodes first); ``random`` picks free
nodes uniformly at random (the classic control). Both ignore racks entirely, so they
cannot honour required locality or segments: ``validate(..., topology=False)`` is the
check that applies to them.
"""

from __future__ import annotations

from placement.model import Fleet, JobRequest, Rack
from placement.plans import PlacementPlan, not_placed
from placement.policies.common import Context, blind_gang_plan, small_candidates, small_plan


def first_fit(fleet: Fleet, job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    gpn = racks[0].gpus_per_node
    if job.is_small(gpn):
        for node in small_candidates(fleet, racks, job.num_gpus, ctx):
            return small_plan(
                job, "first-fit", node, f"lowest-numbered node with {job.num_gpus} free GPUs: {node.id}"
            )
        return not_placed(job, "first-fit", f"no node has {job.num_gpus} free GPUs")
    n = job.nodes_needed(gpn)
    picked: list[str] = []
    for rack in racks:
        if rack.id in ctx.reserved:
            continue
        for i in sorted(rack.free):
            picked.append(fleet.node_at(rack.id, i).id)
            if len(picked) == n:
                return blind_gang_plan(fleet, job, "first-fit", picked, "lowest-numbered free nodes")
    return not_placed(job, "first-fit", f"only {len(picked)} free nodes, {n} needed")


def random_fit(fleet: Fleet, job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    gpn = racks[0].gpus_per_node
    if job.is_small(gpn):
        cands = small_candidates(fleet, racks, job.num_gpus, ctx)
        if not cands:
            return not_placed(job, "random", f"no node has {job.num_gpus} free GPUs")
        node = ctx.random().choice(cands)
        return small_plan(job, "random", node, f"random node with room: {node.id}")
    n = job.nodes_needed(gpn)
    free = [fleet.node_at(r.id, i).id for r in racks if r.id not in ctx.reserved for i in sorted(r.free)]
    if len(free) < n:
        return not_placed(job, "random", f"only {len(free)} free nodes, {n} needed")
    picked = ctx.random().sample(free, n)
    return blind_gang_plan(fleet, job, "random", picked, "random free nodes")
