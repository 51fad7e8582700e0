"""The fragmentation figure: the share of free GPUs (kept spares left out) that the
typical multi-node job cannot use (docs/fragmentation.md)."""

from __future__ import annotations

import json

from placement.fragmentation import fragmentation
from placement.model import Allocation, Fleet, JobRequest
from placement.testing import occupy


def test_an_idle_fleet_is_not_fragmented_whatever_the_typical_job() -> None:
    fleet = Fleet.uniform(2)
    for shapes in (None, {4: 1.0, 8: 1.0, 24: 1.0}, {40: 1.0}, {128: 1.0}, {72: 1.0}):
        report = fragmentation(fleet, shapes)
        assert (report.fragmented_gpus, report.fraction) == (0, 0.0), shapes
        assert report.free_gpus == 144 and report.spare_gpus == 16 and report.counted_gpus == 128
        # A 16-node slice per rack: its 2 spares are kept for recovery.
        assert report.largest_slice_nodes == 16 and report.largest_job_gpus == 64


def test_scattered_idle_nodes_are_fragmented_for_big_jobs() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(13)))  # 5 idle nodes left in r000
    occupy(fleet, "b", 1, list(range(13)))
    report = fragmentation(fleet, {64: 1.0})  # 16-node jobs use none of them
    assert report.free_gpus == 40
    # Preemptible jobs have borrowed the spares: all 5 idle nodes are offered.
    assert report.spare_gpus == 0
    assert report.fragmented_gpus == 40
    assert report.fraction == 1.0
    assert report.largest_job_gpus == 20


def test_the_typical_job_is_the_median_multi_node_shape_by_gpu_demand() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, list(range(13)))  # 5 idle nodes
    # Single-node shapes do not count: the typical job is the 16-node one.
    assert fragmentation(fleet, {4: 9.0, 64: 1.0}).typical_job_gpus == 64
    assert fragmentation(fleet, {4: 9.0, 64: 1.0}).fraction == 1.0
    # Three 2-node jobs ask for fewer GPUs than one 16-node job: still 16 nodes.
    assert fragmentation(fleet, {8: 3.0, 64: 1.0}).typical_job_gpus == 64
    # Mostly 2-node jobs by GPUs too: the 5 idle nodes hold one.
    mostly_small = fragmentation(fleet, {8: 20.0, 64: 1.0})
    assert mostly_small.typical_job_gpus == 8 and mostly_small.fraction == 0.0
    # 8 + 16 + 32 GPUs is under half of 120; with the 64-GPU job it is over.
    jobs = [JobRequest(f"g{i}", num_nodes=n, gpus_per_node=4) for i, n in enumerate((2, 4, 8, 16))]
    assert fragmentation(fleet, jobs).typical_job_gpus == 64
    assert fragmentation(fleet, jobs[:3] + jobs[:3]).typical_job_gpus == 32
    assert fragmentation(fleet, []).typical_from == "default"


def test_leftover_gpus_on_shared_nodes_are_fragmented_and_spares_are_not_counted() -> None:
    fleet = Fleet.uniform(1)
    fleet.allocate(Allocation(JobRequest("s", num_gpus=1), {"r000-n00": (0,)}))
    report = fragmentation(fleet, {8: 1.0})
    # 3 GPUs stuck on r000-n00; of 17 idle nodes, 1 spare is kept (the small job
    # has borrowed the other) and 16 are offered, which hold 2-node jobs.
    assert report.spare_gpus == 4 and report.counted_gpus == 3 + 16 * 4
    assert report.fragmented_gpus == 3
    assert report.racks[0].slice_nodes == 16 == report.largest_slice_nodes


def test_shapes_can_come_from_the_pending_queue() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, list(range(13)))
    jobs = [JobRequest("p1", num_gpus=64), JobRequest("p2", num_gpus=64)]
    report = fragmentation(fleet, jobs)
    assert report.fraction == 1.0
    data = json.loads(json.dumps(report.to_dict()))
    assert data["racks"][0]["idle_nodes"] == 5
