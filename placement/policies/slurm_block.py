"""``slurm-block``: Slurm's ``topology/block`` plugin, as documented.

Followed: slurm.schedmd.com topology.html ("Block Topology") and topology.conf(5)
(``BlockName=``, ``BlockSizes=``), the ``--segment`` option of sbatch(1), and
Slurm's ``src/plugins/topology/block/eval_nodes_block.c`` (the block level comes
from the job's size against the base block size; if no block of that level has
the nodes available, selection fails and the job stays pending).

1. Each rack is a base block. Aggregated blocks at level k are 2**k consecutive base
   blocks (the default ``BlockSizes`` are the powers of two of the base block count),
   and the top level is one block covering every base block present, so a fleet
   whose rack count is not a power of two still has a level that holds the fleet.
2. The job is given the smallest block level whose blocks can hold it (counting, with
   ``--segment``, only the nodes that form whole segments in each base block: 36
   nodes in segments of 12 need three 18-node racks, so the top level on 3 racks).
3. Among the blocks of that level with room, it takes the one with the fewest free
   nodes (best fit). If no block of that level has room, the job waits: it never
   spills to a larger level.
4. With ``--segment`` each segment lies in one base block, placed best fit (the base
   block with the fewest free nodes that holds it); without it the nodes are taken
   from the block's base blocks, fullest-free first.
5. A ``required`` job waits rather than take more base blocks than it needs.
There is no spare logic: every idle node may be allocated. A ``required`` job is
submitted as Slurm users do it, with ``--segment`` equal to the job (or to a whole
block when the job is bigger than one).
"""

from __future__ import annotations

from collections.abc import Callable

from placement.model import REQUIRED, Fleet, JobRequest, Rack
from placement.plans import PlacementPlan, not_placed
from placement.policies.common import Context, min_racks, segment_sizes, small_plan, whole_node_plan

NAME = "slurm-block"


def _free(rack: Rack, ctx: Context) -> int:
    return 0 if rack.id in ctx.reserved else rack.free_count


def job_segment(job: JobRequest, n: int, racks: list[Rack]) -> int | None:
    """The segment a job is submitted with: its own, or for a ``required`` job one
    equal to the job (or to a whole block), as Slurm users ask for it."""
    seg = job.segment_nodes
    if job.locality == REQUIRED and seg is None:
        seg = min(n, max(r.size for r in racks))
    return seg


def block_level(racks: list[Rack], n: int, seg: int | None) -> tuple[int, list[list[Rack]]] | None:
    """Steps 1-2: the smallest level whose aggregated blocks can hold ``n`` nodes (in
    whole segments), and its blocks; the last level is the top block (all racks), also
    when the rack count is not a power of two. None: no block ever holds the job."""

    def capacity(block: list[Rack]) -> int:
        return sum((r.size // seg) * seg if seg else r.size for r in block)

    level = 1
    while True:
        blocks = [racks[i : i + level] for i in range(0, len(racks), level)]
        if max(capacity(b) for b in blocks) >= n:
            return level, blocks
        if level >= len(racks):
            return None
        level = min(level * 2, len(racks))


def block_room(job: JobRequest, racks: list[Rack]) -> Callable[[dict[str, int]], bool]:
    """A test: could a block of the job's level hold it if rack r had ``avail[r]``
    idle nodes? (A necessary condition for :func:`slurm_block` to place a gang;
    backfill uses it to skip future times cheaply.)"""
    gpn = racks[0].gpus_per_node
    n = job.nodes_needed(gpn)
    seg = job_segment(job, n, racks)
    found = block_level(racks, n, seg)
    blocks = [[r.id for r in b] for b in found[1]] if found else []

    def test(avail: dict[str, int]) -> bool:
        return any(sum((avail[r] // seg) * seg if seg else avail[r] for r in b) >= n for b in blocks)

    test.blocks = [(b, n, seg) for b in blocks]  # type: ignore[attr-defined]
    return test


def slurm_block(fleet: Fleet, job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    gpn = racks[0].gpus_per_node
    if job.is_small(gpn):
        return _small(job, racks, ctx)
    n = job.nodes_needed(gpn)
    seg = job_segment(job, n, racks)
    if seg and seg > max(r.size for r in racks):
        return not_placed(job, NAME, f"segment of {seg} nodes is larger than any block")
    # 1-2. Smallest level whose aggregated blocks can hold the job; the last level
    #      is the top block (all racks), also when the count is not a power of two.
    found = block_level(racks, n, seg)
    if found is None:
        return not_placed(job, NAME, f"no block holds {n} nodes{' in whole segments' if seg else ''}")
    level, blocks = found
    # 3. Best fit among blocks of that level that have room right now.
    best: tuple[int, int] | None = None
    for bi, block in enumerate(blocks):
        if seg:
            room = sum((_free(r, ctx) // seg) * seg for r in block)
        else:
            room = sum(_free(r, ctx) for r in block)
        if room < n:
            continue
        free = sum(_free(r, ctx) for r in block)
        if best is None or free < best[0]:
            best = (free, bi)
    if best is None:
        return not_placed(
            job,
            NAME,
            f"no level-{level} block has {n} free nodes {'in whole segments ' if seg else ''}; the job waits",
        )
    block = blocks[best[1]]
    label = f"block {block[0].id}" if level == 1 else f"level-{level} block {block[0].id}.."
    choices = [
        f"smallest block level holding {n} nodes is {level} rack(s); {label} has "
        f"the fewest free nodes ({best[0]}) among blocks with room"
    ]
    picks: list[tuple[Rack, list[int]]] = []
    if seg:
        # 4a. Each segment into the base block with the fewest free nodes that holds it.
        left = {r.id: _free(r, ctx) for r in block}
        taken: dict[str, list[int]] = {r.id: sorted(r.free) for r in block}
        for size in segment_sizes(n, seg):
            fits = [r for r in block if left[r.id] >= size]
            rack = min(fits, key=lambda r: left[r.id])
            slots, taken[rack.id] = taken[rack.id][:size], taken[rack.id][size:]
            left[rack.id] -= size
            picks.append((rack, slots))
            choices.append(f"segment of {size} -> {rack.label} (best fit)")
    else:
        # 4b. Nodes from the block's base blocks, the ones with most free first.
        need = n
        for rack in sorted(block, key=lambda r: -_free(r, ctx)):
            take = min(need, _free(rack, ctx))
            if take:
                picks.append((rack, sorted(rack.free)[:take]))
                need -= take
            if need == 0:
                break
    plan = whole_node_plan(fleet, job, NAME, picks, choices[0], choices)
    if job.locality == REQUIRED and plan.placed:
        # 5. A required job waits rather than take more base blocks than it needs,
        #    as with --exclusive=topo (a fragmented aggregated block would otherwise
        #    hand it nodes from one rack too many).
        size = max(fleet.rack_by_id[r].size for r in plan.racks)
        fewest = min_racks(n, size, job.segment_nodes)
        if len(plan.racks) > fewest:
            return not_placed(
                job,
                NAME,
                f"{label} would spread it over {len(plan.racks)} racks where "
                f"{fewest} would hold it; the job waits",
            )
    return plan


def _small(job: JobRequest, racks: list[Rack], ctx: Context) -> PlacementPlan:
    # A single-node job is level 0: best fit over base blocks (fewest nodes with room),
    # then the lowest-numbered node with enough free GPUs (cons_tres order).
    best: tuple[int, int, Rack] | None = None
    for pos, rack in enumerate(racks):
        reserved = rack.id in ctx.reserved
        avail = sum(
            1 for nd in rack.nodes if nd.free_gpus >= job.num_gpus and not (reserved and nd.used == 0)
        )
        if avail and (best is None or avail < best[0]):
            best = (avail, pos, rack)
    if best is None:
        return not_placed(job, NAME, f"no node has {job.num_gpus} free GPUs")
    rack = best[2]
    reserved = rack.id in ctx.reserved
    node = next(nd for nd in rack.nodes if nd.free_gpus >= job.num_gpus and not (reserved and nd.used == 0))
    return small_plan(
        job,
        NAME,
        node,
        f"block {rack.label} has the fewest nodes with room ({best[0]}); lowest-numbered node {node.label}",
    )
