"""The rack-level fragmentation metric."""

from __future__ import annotations

import json

from placement.fragmentation import fragmentation
from placement.model import Allocation, Fleet, JobRequest
from placement.testing import occupy


def test_an_empty_fleet_is_not_fragmented_for_shapes_that_tile_a_rack() -> None:
    fleet = Fleet.uniform(2)
    report = fragmentation(fleet, {4: 1.0, 8: 1.0, 24: 1.0})  # 1, 2 and 6 nodes: tile 18
    assert report.fragmented_gpus == 0
    assert report.largest_job_gpus == 72


def test_scattered_idle_nodes_are_fragmented_for_big_shapes() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(13)))  # 5 idle nodes left in r000
    occupy(fleet, "b", 1, list(range(13)))
    report = fragmentation(fleet, {64: 1.0})  # 16-node jobs use none of them
    assert report.free_gpus == 40
    assert report.fragmented_gpus == 40
    assert report.fraction == 1.0
    assert report.largest_job_gpus == 20


def test_weights_follow_how_common_each_shape_is() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, list(range(13)))
    mostly_small = fragmentation(fleet, {4: 9.0, 64: 1.0}).fragmented_gpus
    mostly_big = fragmentation(fleet, {4: 1.0, 64: 9.0}).fragmented_gpus
    assert mostly_small < mostly_big


def test_leftover_gpus_on_shared_nodes_count_for_whole_node_shapes() -> None:
    fleet = Fleet.uniform(1)
    fleet.allocate(Allocation(JobRequest("s", num_gpus=1), {"r000-n00": (0,)}))
    report = fragmentation(fleet, {8: 1.0})
    # 3 GPUs stuck on r000-n00, and 17 idle nodes of which 1 cannot pair up.
    assert report.fragmented_gpus == 3 + 4


def test_shapes_can_come_from_the_pending_queue() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, list(range(13)))
    jobs = [JobRequest("p1", num_gpus=64), JobRequest("p2", num_gpus=64)]
    report = fragmentation(fleet, jobs)
    assert report.fraction == 1.0
    data = json.loads(json.dumps(report.to_dict()))
    assert data["racks"][0]["idle_nodes"] == 5
