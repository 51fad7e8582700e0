"""Recovery of a running job when nodes fail: swap, preempt, move, requeue."""

from __future__ import annotations

import json

from placement.model import Allocation, Fleet, JobRequest
from placement.recover import apply_recovery, recover
from placement.testing import occupy
from placement.validate import validate, validate_recovery


def _fail(fleet: Fleet, *nodes: str) -> None:
    for n in nodes:
        fleet.set_health(n, "failed")


def test_it_swaps_a_failed_node_for_a_spare_in_the_same_rack() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "job", 0, list(range(16)))
    plan = recover(fleet, "job", ["r000-n03"])
    assert plan.action == "swap"
    assert plan.swaps["r000-n03"].startswith("r000-")
    _fail(fleet, "r000-n03")
    alloc = apply_recovery(fleet, plan)
    assert alloc is not None
    # Every other node stays where it was.
    assert set(alloc.nodes) - {plan.swaps["r000-n03"]} == {f"r000-n{i:02d}" for i in range(16) if i != 3}
    assert validate(fleet) == []


def test_it_handles_several_failed_nodes_of_one_job_at_once() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, list(range(16)))
    plan = recover(fleet, "job", ["r000-n00", "r000-n01"])
    assert plan.action == "swap"
    assert sorted(plan.swaps.values()) == ["r000-n16", "r000-n17"]


def test_it_preempts_a_lower_priority_preemptible_job_in_the_rack() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "job", 0, list(range(16)), priority=5)
    occupy(fleet, "cheap", 0, [16, 17], priority=0)
    occupy(fleet, "elsewhere", 1, list(range(18)))
    plan = recover(fleet, "job", ["r000-n02"])
    assert plan.action == "preempt_swap"
    assert plan.preempted == ["cheap"]
    _fail(fleet, "r000-n02")
    apply_recovery(fleet, plan)
    assert "cheap" not in fleet.allocations
    assert validate(fleet) == []


def test_it_never_preempts_a_non_preemptible_job() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, list(range(16)), priority=5)
    occupy(fleet, "keep", 0, [16, 17], priority=0, preemptible=False)
    plan = recover(fleet, "job", ["r000-n02"])
    assert plan.action == "requeue"
    assert "keep" not in plan.preempted


def test_it_moves_the_whole_job_when_the_rack_has_no_room() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "job", 0, list(range(16)))
    occupy(fleet, "peer", 0, [16, 17], priority=3)
    plan = recover(fleet, "job", ["r000-n05"])
    assert plan.action == "move"
    assert {fleet.nodes[n].rack for n in plan.new_nodes} == {"r001"}
    assert validate_recovery(fleet, plan) == []


def test_it_requeues_when_nothing_else_works() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, list(range(16)))
    occupy(fleet, "peer", 0, [16, 17], priority=3)
    plan = recover(fleet, "job", ["r000-n05"])
    assert plan.action == "requeue"
    assert plan.reason and plan.steps
    json.dumps(plan.to_dict())


def test_a_small_job_moves_to_a_node_with_room_in_its_rack() -> None:
    fleet = Fleet.uniform(1)
    fleet.allocate(Allocation(JobRequest("s", num_gpus=2), {"r000-n00": (0, 1)}))
    plan = recover(fleet, "s", ["r000-n00"])
    assert plan.action == "swap"
    _fail(fleet, "r000-n00")
    alloc = apply_recovery(fleet, plan)
    assert alloc is not None and alloc.gpus == 2
    assert validate(fleet) == []


def test_planning_leaves_the_fleet_unchanged() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "job", 0, list(range(16)))
    before = fleet.to_dict()
    recover(fleet, "job", ["r000-n03"])
    assert fleet.to_dict() == before


def test_a_node_outside_the_job_needs_no_recovery() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, [0, 1])
    assert recover(fleet, "job", ["r000-n09"]).action == "none"


def test_a_non_preemptible_gang_takes_back_spares_lent_to_preemptible_jobs() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, list(range(16)), preemptible=False)
    occupy(fleet, "borrower", 0, [16, 17])  # same priority, preemptible
    plan = recover(fleet, "job", ["r000-n07"])
    assert plan.action == "preempt_swap" and plan.preempted == ["borrower"]


def test_a_preemptible_gang_only_preempts_lower_priority_jobs() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, list(range(16)))
    occupy(fleet, "peer", 0, [16, 17])
    assert recover(fleet, "job", ["r000-n07"]).action == "requeue"


def test_a_move_never_spreads_a_job_over_more_racks_than_it_needs() -> None:
    fleet = Fleet.uniform(3)
    occupy(fleet, "job", 0, list(range(12)))
    occupy(fleet, "peer", 0, list(range(12, 18)), priority=9)
    occupy(fleet, "a", 1, list(range(10)), priority=9)
    occupy(fleet, "b", 2, list(range(10)), priority=9)
    # 8 idle nodes in each of r001 and r002: 12 nodes would need both racks.
    assert recover(fleet, "job", ["r000-n01"]).action == "requeue"


def test_with_a_clock_it_preempts_the_job_that_checkpointed_last() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "job", 0, list(range(16)), preemptible=False)
    early = occupy(fleet, "early", 0, [16])
    late = occupy(fleet, "late", 0, [17])
    now = 7_300.0
    early.started_at = 3_900.0  # 3,400 s of work since its last checkpoint
    late.started_at = 7_200.0  # 100 s since it started: little to lose
    assert recover(fleet, "job", ["r000-n03"], now=now).preempted == ["late"]
    early.started_at, late.started_at = 7_200.0, 3_900.0
    assert recover(fleet, "job", ["r000-n03"], now=now).preempted == ["early"]


def test_a_plan_is_not_refused_for_another_job_still_on_a_failed_node() -> None:
    """Two nodes fail under two jobs: the first job's plan is checked for what it
    changes; the second job, awaiting its own recovery, is not its violation (the
    service requeued the first job for it)."""
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, [0, 1])
    occupy(fleet, "b", 0, [2, 3])
    plan = recover(fleet, "a", ["r000-n00"])
    _fail(fleet, "r000-n00")
    _fail(fleet, "r000-n02")
    assert plan.action == "swap"
    assert validate_recovery(fleet, plan) == []
    apply_recovery(fleet, plan)
    assert {v.job_id for v in validate(fleet)} == {"b"}
