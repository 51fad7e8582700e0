"""The invariant checker catches each kind of broken allocation."""

from __future__ import annotations

import pytest

from placement.model import Allocation, Fleet, JobRequest
from placement.place import place
from placement.testing import gang
from placement.validate import InvariantError, validate


def _rules(fleet: Fleet, allocs: dict[str, Allocation]) -> set[str]:
    return {v.rule for v in validate(fleet, allocs)}


def test_a_clean_fleet_has_no_violations() -> None:
    fleet = Fleet.uniform(2)
    job = gang("g", 4)
    fleet.allocate(place(fleet, job).allocation(job))
    assert validate(fleet) == []


def test_it_catches_a_gpu_held_twice() -> None:
    fleet = Fleet.uniform(1)
    a = Allocation(JobRequest("a", num_gpus=1), {"r000-n00": (0,)})
    b = Allocation(JobRequest("b", num_gpus=1), {"r000-n00": (0,)})
    assert "double-gpu" in _rules(fleet, {"a": a, "b": b})


def test_it_catches_a_job_on_a_failed_node() -> None:
    fleet = Fleet.uniform(1)
    fleet.set_health("r000-n00", "failed")
    a = Allocation(JobRequest("a", num_gpus=1), {"r000-n00": (0,)})
    assert "failed-node" in _rules(fleet, {"a": a})


def test_it_catches_a_gang_that_is_not_whole() -> None:
    fleet = Fleet.uniform(1)
    job = gang("g", 2)
    half = Allocation(job, {"r000-n00": (0, 1, 2, 3), "r000-n01": (0, 1)})
    short = Allocation(job, {"r000-n00": (0, 1, 2, 3)})
    assert "gang" in _rules(fleet, {"g": half})
    assert "gang" in _rules(fleet, {"g": short})


def test_it_catches_a_segment_across_racks() -> None:
    fleet = Fleet.uniform(2)
    job = gang("g", 2, segment_nodes=2)
    nodes = {"r000-n00": (0, 1, 2, 3), "r001-n00": (0, 1, 2, 3)}
    alloc = Allocation(job, nodes, [list(nodes)])
    assert "segment-span" in _rules(fleet, {"g": alloc})


def test_it_catches_required_locality_broken() -> None:
    fleet = Fleet.uniform(2)
    job = gang("g", 2, "required")
    nodes = {"r000-n00": (0, 1, 2, 3), "r001-n00": (0, 1, 2, 3)}
    alloc = Allocation(job, nodes, [["r000-n00"], ["r001-n00"]])
    assert "locality" in _rules(fleet, {"g": alloc})
    # The same spread is fine for a preferred job, and topology=False skips the rule.
    assert validate(fleet, {"g": alloc}, topology=False) == []


def test_it_checks_a_plan_before_it_is_applied_and_can_raise() -> None:
    fleet = Fleet.uniform(1)
    job = gang("g", 18)
    plan = place(fleet, job)
    fleet.set_health("r000-n04", "failed")
    with pytest.raises(InvariantError):
        validate(fleet, plan, job=job, raise_on_error=True)
