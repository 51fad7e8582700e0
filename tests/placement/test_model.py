"""The fleet model keeps its indexes right through allocate, release and failures."""

from __future__ import annotations

import pytest

from placement.model import Allocation, CapacityError, Fleet, JobRequest
from placement.testing import occupy


def test_a_uniform_fleet_has_the_shape_asked_for() -> None:
    fleet = Fleet.uniform(3, 18, 4)
    assert len(fleet.racks) == 3
    assert fleet.total_gpus == 3 * 72
    assert all(r.free_count == 18 for r in fleet.racks)


def test_it_tracks_idle_nodes_per_rack_through_allocate_and_release() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, [0, 1, 2])
    assert fleet.racks[0].free_count == 15
    fleet.release("a")
    assert fleet.racks[0].free_count == 18


def test_it_refuses_a_gpu_that_is_already_held() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, [0])
    job = JobRequest("b", num_gpus=1)
    with pytest.raises(CapacityError):
        fleet.allocate(Allocation(job, {"r000-n00": (2,)}))


def test_it_refuses_a_failed_node() -> None:
    fleet = Fleet.uniform(1)
    fleet.set_health("r000-n03", "failed")
    assert fleet.racks[0].free_count == 17
    with pytest.raises(CapacityError):
        fleet.allocate(Allocation(JobRequest("b", num_gpus=1), {"r000-n03": (0,)}))


def test_small_and_preemptible_jobs_count_as_borrowing_spares() -> None:
    fleet = Fleet.uniform(1)
    fleet.allocate(Allocation(JobRequest("s", num_gpus=1), {"r000-n05": (0,)}))
    rack = fleet.racks[0]
    assert rack.lent_nodes == 1
    assert rack.unlent_spares() == 1
    assert rack.slice_offer() == 16
    assert fleet.partial[3] == {"r000-n05"}
    fleet.allocate(
        Allocation(
            JobRequest("keep", num_gpus=8, preemptible=False),
            {"r000-n06": (0, 1, 2, 3), "r000-n07": (0, 1, 2, 3)},
        )
    )
    assert rack.lent_nodes == 1
    fleet.allocate(
        Allocation(JobRequest("pre", num_gpus=8), {"r000-n08": (0, 1, 2, 3), "r000-n09": (0, 1, 2, 3)})
    )
    assert rack.lent_nodes == 3 and rack.unlent_spares() == 0


def test_mixed_rack_shapes_live_in_one_fleet() -> None:
    fleet = Fleet.from_shapes([(1, 18, 4, 2), (1, 9, 4, 1), (2, 1, 8, 0)])
    assert [r.size for r in fleet.racks] == [18, 9, 1, 1]
    assert sorted(fleet.groups) == [4, 8]


def test_a_job_needs_num_gpus_or_a_node_shape() -> None:
    with pytest.raises(ValueError):
        JobRequest("x")
    with pytest.raises(ValueError):
        JobRequest("x", num_nodes=2)
    assert JobRequest("x", num_nodes=3, gpus_per_node=4).total_gpus == 12
    assert JobRequest("y", num_gpus=9).nodes_needed(4) == 3


def test_a_fleet_survives_a_json_round_trip() -> None:
    import json

    fleet = Fleet.from_shapes([(2, 18, 4, 2), (1, 1, 8, 0)])
    occupy(fleet, "a", 0, [0, 1, 2], priority=3, preemptible=False)
    fleet.allocate(Allocation(JobRequest("s", num_gpus=2), {"r001-n04": (1, 2)}))
    fleet.set_health("r000-n01", "failed")  # "a" still sits there, awaiting recovery
    data = json.loads(json.dumps(fleet.to_dict()))
    back = Fleet.from_dict(data)
    assert back.to_dict() == fleet.to_dict()
    assert back.allocations["a"].job.priority == 3
    assert back.racks[0].free_count == fleet.racks[0].free_count
