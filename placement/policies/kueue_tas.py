"""``kueue-tas``: Kueue Topology-Aware Scheduling, rack level, as documented.

Followed: kueue.sigs.k8s.io "Topology Aware Scheduling" concepts page and
KEP-2724 (algorithm section; profiles BestFit and LeastFreeCapacity, the
``TASProfileMixed`` behaviour: BestFit for required/preferred, LeastFreeCapacity
for unconstrained workloads), and podset slices (``podset-slice-size`` with a
slice-required topology) for segments.

Capacity is counted in pods, one pod per whole node (in slices when segmented).

* required (fits a rack): BestFit on racks. Sorting by most free capacity and then
  swapping the last domain for the tightest one that still fits gives the rack with
  the least capacity that holds the whole job. None: wait.
* preferred, or bigger than a rack: same, and if no rack holds it, go one level up
  (the whole fleet) and take racks by most free capacity until the job fits, the last
  one swapped for the tightest that holds the remainder.
* none (unconstrained): LeastFreeCapacity: racks by least free capacity first.
* single-node jobs: the node with the least free GPUs that fits, in the rack with
  the least free capacity (LeastFreeCapacity, node level).
"""

from __future__ import annotations

from placement.model import NONE, PREFERRED, REQUIRED, Fleet, JobRequest, Rack
from placement.plans import PlacementPlan, not_placed
from placement.policies.common import Context, min_racks, segment_sizes, small_plan, whole_node_plan

NAME = "kueue-tas"


def kueue_tas(fleet: Fleet, job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    gpn = racks[0].gpus_per_node
    if job.is_small(gpn):
        return _small(job, racks, ctx)
    n = job.nodes_needed(gpn)
    seg = job.segment_nodes or n
    size = max(r.size for r in racks)
    if job.segment_nodes is None and n > size:
        seg = size  # podset slices of a rack's size when the job is bigger than a rack
    seg = min(seg, n)

    def cap(rack: Rack) -> int:  # capacity in slices of ``seg`` nodes
        return 0 if rack.id in ctx.reserved else rack.free_count // seg

    slices = segment_sizes(n, seg)
    pos = {r.id: i for i, r in enumerate(racks)}
    if job.locality == NONE:
        # LeastFreeCapacity: fill the fullest racks first.
        order = sorted((r for r in racks if cap(r) or r.free_count), key=lambda r: (r.free_count, pos[r.id]))
        return _take(fleet, job, order, slices, ctx, "LeastFreeCapacity")
    if n <= size:
        # The whole job in one rack, slices whole: the tightest rack that holds it.
        fits = [r for r in racks if r.id not in ctx.reserved and r.free_count >= n and cap(r) >= n // seg]
        if fits:
            rack = min(fits, key=lambda r: (r.free_count, pos[r.id]))
            why = f"BestFit: {rack.label} is the tightest rack that holds {n} nodes"
            slots = sorted(rack.free)[:n]
            picks = [(rack, slots[i : i + seg]) for i in range(0, n, seg)]
            return whole_node_plan(fleet, job, NAME, picks, why, [why])
        if job.locality == REQUIRED:
            return not_placed(job, NAME, f"required: no rack has {n} free nodes; waits")
    if job.locality == PREFERRED and job.segment_nodes is None:
        # Preferred spills upward with no slice constraint: pods (nodes) one by one.
        slices = [1] * n

        def cap(rack: Rack) -> int:
            return 0 if rack.id in ctx.reserved else rack.free_count

    # BestFit one level up: most free first, last domain the tightest that fits.
    order = sorted(racks, key=lambda r: (-cap(r), pos[r.id]))
    plan = _take(fleet, job, order, slices, ctx, "BestFit")
    if plan.placed and job.locality == REQUIRED and len(plan.racks) > min_racks(n, size, job.segment_nodes):
        return not_placed(job, NAME, "required: the fewest racks do not have room; waits")
    return plan


def _take(
    fleet: Fleet, job: JobRequest, order: list[Rack], slices: list[int], ctx: Context, profile: str
) -> PlacementPlan:
    """Greedy over ``order``; the last rack is swapped for the tightest that fits."""
    left = {r.id: (0 if r.id in ctx.reserved else r.free_count) for r in order}
    free_slots = {r.id: sorted(r.free) for r in order}
    picks: list[tuple[Rack, list[int]]] = []
    remaining = list(slices)
    used: list[Rack] = []
    i = 0
    while remaining and i < len(order):
        rack = order[i]
        i += 1
        fit = [s for s in remaining if s <= left[rack.id]]
        if not fit:
            continue
        # Would this rack be the last one? Then take the tightest rack for the rest.
        need = sum(remaining)
        if need <= left[rack.id] and profile == "BestFit":
            tight = [r for r in order if r not in used and left[r.id] >= need]
            rack = min(tight, key=lambda r: left[r.id])
        used.append(rack)
        for s in sorted(remaining, reverse=True):
            if s <= left[rack.id]:
                picks.append((rack, free_slots[rack.id][:s]))
                free_slots[rack.id] = free_slots[rack.id][s:]
                left[rack.id] -= s
                remaining.remove(s)
    if remaining:
        return not_placed(job, NAME, f"{profile}: not enough free nodes in whole slices; waits")
    if max(slices) == 1:  # single-pod slices: one segment per rack
        merged: dict[str, tuple[Rack, list[int]]] = {}
        for rack, slots in picks:
            merged.setdefault(rack.id, (rack, []))[1].extend(slots)
        picks = list(merged.values())
    why = f"{profile}: {len(used)} rack(s) " + ", ".join(r.id for r in used)
    return whole_node_plan(fleet, job, NAME, picks, why, [why])


def _small(job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    best = None
    for pos, rack in enumerate(racks):
        reserved = rack.id in ctx.reserved
        for node in rack.nodes:
            f = node.free_gpus
            if f >= job.num_gpus and not (reserved and node.used == 0):
                key = (rack.free_count, f, pos, node.index)
                if best is None or key < best[0]:
                    best = (key, node)
    if best is None:
        return not_placed(job, NAME, f"no node has {job.num_gpus} free GPUs")
    node = best[1]
    return small_plan(
        job,
        NAME,
        node,
        f"LeastFreeCapacity: {node.label} ({node.free_gpus} free GPUs) in the rack with least free capacity",
    )
