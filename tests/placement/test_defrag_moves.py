"""A defrag plan moves each job at most once (#28 item 13). On demo-shaped fleets a
job moved out of one rack could land in a rack a later goal cleared and be moved
again: two restarts for no gain, and the service's action-jobs constraint
answered 500. Each job is now stopped once, from where it runs to where it ends;
the plan's moves, applied in order, are valid, and its cost is theirs."""

from __future__ import annotations

import random

import pytest

from placement.defrag import FreeRacks, defragment
from placement.model import DRAINING, FAILED, Allocation, Fleet, JobRequest
from placement.testing import occupy
from placement.validate import validate

SHAPES = [1, 2, 2, 4, 4, 8, 8, 16, 0, 0, 0]  # nodes of a gang; 0: a one-node job of 1-4 GPUs


def demo_fleet(rng: random.Random) -> Fleet:
    """3-8 NVL72 racks filled left to right with the demo's gangs, one-node jobs of
    1-4 GPUs and idle nodes (8 in 10 jobs preemptible), then up to three idle
    nodes failed or draining."""
    racks = rng.randint(3, 8)
    fleet = Fleet.uniform(racks)
    n = 0
    for r in range(racks):
        slot = 0
        while slot < 18:
            n += 1
            nodes = rng.choice(SHAPES)
            if nodes == 0:
                gpus = rng.choice([1, 2, 4])
                nid = fleet.node_at(fleet.racks[r].id, slot).id
                job = JobRequest(f"s{n}", num_gpus=gpus, preemptible=rng.random() < 0.8)
                fleet.allocate(Allocation(job, {nid: tuple(range(gpus))}, [[nid]]))
                slot += 1
                continue
            if slot + nodes > 18 or rng.random() < 0.3:
                slot += 1
                continue
            occupy(fleet, f"g{n}", r, list(range(slot, slot + nodes)), preemptible=rng.random() < 0.8)
            slot += nodes
    for nid in rng.sample(sorted(fleet.nodes), 3):
        if not fleet.nodes[nid].jobs:
            fleet.set_health(nid, rng.choice([FAILED, DRAINING]))
    return fleet


def pending_gangs(rng: random.Random) -> list[JobRequest]:
    return [
        JobRequest(
            f"p{i}",
            num_gpus=4 * rng.choice([8, 12, 16, 32]),
            segment_nodes=rng.choice([None, None, 16]),
            locality=rng.choice(["required", "preferred"]),
        )
        for i in range(rng.randint(0, 4))
    ]


@pytest.mark.parametrize("first_seed", range(0, 400, 100))
def test_a_plan_moves_each_job_once_and_its_moves_apply_in_order(first_seed):
    for seed in range(first_seed, first_seed + 100):
        rng = random.Random(seed)
        fleet = demo_fleet(rng)
        pending = pending_gangs(rng)
        target = rng.choice([FreeRacks(rng.randint(1, 3)), None])
        # The API's defaults: 200 GPU-hours, 8 moves.
        plan = defragment(fleet, pending, target, budget_gpu_hours=200, max_moves=8)

        moved = [m.job_id for m in plan.moves]
        assert len(moved) == len(set(moved)), (seed, moved)
        assert abs(plan.cost_gpu_hours - sum(m.cost_gpu_hours for m in plan.moves)) < 1e-9
        for m in plan.moves:
            old = fleet.release(m.job_id)
            assert sorted(old.nodes) == sorted(m.from_nodes), seed
            fleet.allocate(Allocation(old.job, dict(m.to_nodes), m.to_segments))
        assert validate(fleet) == [], seed
