"""Job colours for the rack grids: a categorical palette, assigned rack by rack so
that jobs whose cells touch never share a hue bucket, and no job looks like a
node state.

Pure Python (no Django): ``fleet.events.rack_state`` calls :func:`job_colors` on
each rack's cells and sends the slot of each job with the rack event;
``static/rackwise/grid.js`` draws slot ``i`` as ``PALETTE[i]`` (a copy of
:data:`PALETTE`, checked equal by ``tests/test_palette.py``).

1. Hues are put in 30-degree buckets (``hue // 30``). The states' hues (failed
   red, draining amber, in-repair purple: the patterns in ``templates/base.html``)
   own their buckets, and those of the hues within 15 degrees of them (red sits
   on the 0/360 seam). No palette hue is in those buckets, so no job reads as a
   state.
2. Each palette slot has a hue bucket of its own, so two slots never share one.
3. Jobs are the vertices of a graph, with an edge where two jobs' cells touch in
   the grid (one row per node in slot order, one cell per GPU; side or corner).
4. Colouring is greedy in smallest-last (degeneracy) order: remove a job of least
   remaining degree until none is left, and colour them in reverse order of
   removal. A job then has at most ``d`` coloured neighbours when its turn comes
   (``d`` the degeneracy), so ``d + 1`` slots suffice. In a grid of whole-node
   jobs and single GPUs ``d`` is at most 5 (no single GPU has 6 neighbours once
   the edge columns are peeled, and 18 rows give whole-node jobs 17 contacts, too
   few for a 6-core), so the palette's 7 slots always do.
5. A job takes its stable slot (its id modulo the palette) unless a coloured
   neighbour has it, so it keeps one colour in every rack, and across changes,
   wherever it can; else the next free slot after that one.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

BUCKET_DEG = 30

# The hues of the state patterns (templates/base.html): failed #ff6b6b/#7a1010,
# draining #ffb84d, in repair #c9a6ff/#3b2a55.
STATE_HUES: dict[str, int] = {"failed": 0, "draining": 36, "in_repair": 263}
# A state owns the bucket of every hue within this margin of it: red sits on the
# 0/360 seam and purple 7 degrees from the next bucket, and a hue just across a
# bucket's edge looks the same.
STATE_MARGIN_DEG = 15

# (hue, lightness %) per slot, saturation 62%; one bucket each, none a state's;
# ordered so that the stable slots of consecutive job ids are far apart in hue.
PALETTE: tuple[tuple[int, int], ...] = (
    (200, 50),  # azure
    (135, 40),  # green
    (315, 56),  # magenta
    (75, 42),  # olive
    (165, 38),  # teal
    (225, 60),  # blue
    (105, 48),  # leaf green
)


def bucket(hue: float) -> int:
    return int(hue % 360) // BUCKET_DEG


def state_buckets() -> frozenset[int]:
    """The buckets no job hue may fall in (step 1)."""
    return frozenset(
        bucket(h + d) for h in STATE_HUES.values() for d in range(-STATE_MARGIN_DEG, STATE_MARGIN_DEG + 1)
    )


def stable_slot(job_id: int) -> int:
    """The slot a job prefers in every rack."""
    return job_id % len(PALETTE)


def neighbours(grid: Sequence[Sequence[int | None]]) -> dict[int, set[int]]:
    """Each job's neighbouring jobs: cells that touch at a side or a corner.
    ``grid`` holds one row per node (in slot order), one job id or None per GPU."""
    out: dict[int, set[int]] = {}
    for r, row in enumerate(grid):
        for c, job in enumerate(row):
            if job is None:
                continue
            out.setdefault(job, set())
            for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1)):  # each pair once
                rr, cc = r + dr, c + dc
                if 0 <= rr < len(grid) and 0 <= cc < len(grid[rr]):
                    other = grid[rr][cc]
                    if other is not None and other != job:
                        out[job].add(other)
                        out.setdefault(other, set()).add(job)
    return out


def smallest_last(adj: dict[int, set[int]]) -> list[int]:
    """Jobs in smallest-last order: the last one removed first. Ties go to the
    lower job id, so the order (and the colouring) is deterministic. A heap with
    stale entries skipped: this runs for every rack of the console's snapshot."""
    degree = {v: len(ns) for v, ns in adj.items()}
    heap = [(d, v) for v, d in degree.items()]
    heapq.heapify(heap)
    removed: list[int] = []
    done: set[int] = set()
    while heap:
        d, v = heapq.heappop(heap)
        if v in done or d != degree[v]:
            continue
        done.add(v)
        removed.append(v)
        for n in adj[v]:
            if n not in done:
                degree[n] -= 1
                heapq.heappush(heap, (degree[n], n))
    return removed[::-1]


def job_colors(grid: Sequence[Sequence[int | None]]) -> dict[int, int]:
    """The palette slot of each job in one rack's grid (steps 3-5 above). If a
    grid ever needed more slots than the palette has, the job takes the slot
    fewest of its neighbours hold."""
    adj = neighbours(grid)
    size = len(PALETTE)
    slot: dict[int, int] = {}
    for job in smallest_last(adj):
        taken = [slot[n] for n in adj[job] if n in slot]
        start = stable_slot(job)
        order = [(start + i) % size for i in range(size)]
        free = [s for s in order if s not in taken]
        slot[job] = free[0] if free else min(order, key=taken.count)
    return slot
