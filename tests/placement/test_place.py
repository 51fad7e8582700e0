"""Placement decisions: what each policy does, and rackwise's own rules."""

from __future__ import annotations

import json

import pytest

from placement.model import Fleet, JobRequest
from placement.place import place, schedule, what_if
from placement.testing import gang, occupy
from placement.validate import validate

POLICIES = ["rackwise", "first-fit", "random", "slurm-block", "slurm-block-greedy", "kueue-tas"]


def test_rackwise_keeps_two_spares_in_a_healthy_rack() -> None:
    fleet = Fleet.uniform(1)
    big = gang("big", 16, preemptible=False)
    plan = place(fleet, big)
    assert plan.placed
    fleet.allocate(plan.allocation(big))
    # Two idle nodes are left, but they are spares: a non-preemptible 4-node gang may
    # not take them, nor a 3-node one.
    job = gang("next", 3, preemptible=False)
    assert not place(fleet, job).placed
    assert "spares" in place(fleet, job).reason


def test_preemptible_gangs_may_borrow_spares() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "big", 0, list(range(15)), preemptible=False)
    assert not place(fleet, gang("stiff", 3, preemptible=False)).placed
    assert place(fleet, gang("soft", 3, preemptible=True)).placed


def test_small_jobs_may_borrow_spares() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "big", 0, list(range(16)))
    plan = place(fleet, JobRequest("s", num_gpus=2, locality="none"))
    assert plan.placed
    assert plan.racks == ["r000"]


def test_a_gang_too_big_for_a_slice_may_take_the_whole_rack() -> None:
    fleet = Fleet.uniform(2)
    plan = place(fleet, gang("g", 18))
    assert plan.placed and len(plan.racks) == 1


def test_rackwise_splits_24_nodes_into_12_plus_12() -> None:
    fleet = Fleet.uniform(4)
    plan = place(fleet, gang("g", 24))
    assert sorted(len(s) for s in plan.segments) == [12, 12]
    assert len(plan.racks) == 2


def test_rackwise_puts_several_segments_on_the_rack_that_holds_them_all() -> None:
    # 12 nodes in segments of 4 need one rack. Best fit would take r000 (4 idle nodes,
    # the smallest offer that holds a segment) and then have no rack left for the
    # other two segments; r001 holds all three.
    fleet = Fleet.uniform(2, spare_nodes=0)
    occupy(fleet, "busy", 0, list(range(14)))
    job = gang("g", 12, "required", segment_nodes=4)
    plan = place(fleet, job)
    assert plan.placed, plan.reason
    assert plan.racks == ["r001"]
    assert sorted(len(s) for s in plan.segments) == [4, 4, 4]
    fleet.allocate(plan.allocation(job))
    assert validate(fleet) == []


def test_segments_over_several_racks_take_the_racks_with_room_when_best_fit_cannot() -> None:
    # 24 nodes in segments of 8: two racks (16 each). Offers 8, 8 and 18: best fit
    # spends both racks on the 8s (one segment each); 18 + 8 hold all three.
    fleet = Fleet.uniform(3, spare_nodes=0)
    occupy(fleet, "a", 0, list(range(10)))
    occupy(fleet, "b", 1, list(range(10)))
    job = gang("g", 24, "required", segment_nodes=8)
    plan = place(fleet, job)
    assert plan.placed, plan.reason
    assert len(plan.racks) == 2 and "r002" in plan.racks
    fleet.allocate(plan.allocation(job))
    assert validate(fleet) == []


def test_rackwise_best_fits_a_gang_onto_the_tightest_rack() -> None:
    fleet = Fleet.uniform(3)
    occupy(fleet, "a", 1, list(range(8)))  # r001 offers 8 beyond its spares
    plan = place(fleet, gang("g", 6))
    assert plan.racks == ["r001"]
    assert "best fit" in plan.reason


def test_rackwise_packs_small_jobs_into_busy_racks() -> None:
    fleet = Fleet.uniform(3)
    occupy(fleet, "a", 2, list(range(10)))
    plan = place(fleet, JobRequest("s", num_gpus=1, locality="none"))
    assert plan.racks == ["r002"]
    fleet.allocate(plan.allocation(JobRequest("s", num_gpus=1, locality="none")))
    # The next small job shares the partly used node rather than opening another.
    plan2 = place(fleet, JobRequest("t", num_gpus=2, locality="none"))
    assert list(plan2.nodes) == list(plan.nodes)


def test_rackwise_waits_rather_than_span_when_a_clock_is_given() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(10)))
    occupy(fleet, "b", 1, list(range(10)))
    job = gang("g", 9, submit_time=0.0, expected_duration=3600.0)
    assert not place(fleet, job, now=60.0).placed
    assert place(fleet, job).placed  # no clock: span at once (preferred)


def test_required_locality_never_spans() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(10)))
    occupy(fleet, "b", 1, list(range(10)))
    for policy in ("rackwise", "slurm-block", "kueue-tas"):
        assert not place(fleet, gang("g", 12, "required"), policy).placed


def test_first_fit_takes_the_lowest_numbered_free_nodes() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, [0, 1])
    plan = place(fleet, gang("g", 3), "first-fit")
    assert list(plan.nodes) == ["r000-n02", "r000-n03", "r000-n04"]


def test_random_is_deterministic_for_a_seed() -> None:
    fleet = Fleet.uniform(4)
    a = place(fleet, gang("g", 6), "random", seed=3)
    b = place(fleet, gang("g", 6), "random", seed=3)
    c = place(fleet, gang("g", 6), "random", seed=4)
    assert a.nodes == b.nodes
    assert a.nodes != c.nodes


def test_slurm_block_takes_the_block_with_fewest_free_nodes() -> None:
    fleet = Fleet.uniform(3)
    occupy(fleet, "a", 2, list(range(12)))
    plan = place(fleet, gang("g", 5), "slurm-block")
    assert plan.racks == ["r002"]


def test_slurm_block_waits_rather_than_spill() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(10)))
    occupy(fleet, "b", 1, list(range(10)))
    plan = place(fleet, gang("g", 12, "none"), "slurm-block")
    assert not plan.placed
    assert "waits" in plan.reason


def test_slurm_block_puts_each_segment_in_one_block() -> None:
    fleet = Fleet.uniform(4)
    occupy(fleet, "a", 0, list(range(6)))
    job = gang("g", 24, segment_nodes=8)
    plan = place(fleet, job, "slurm-block")
    assert plan.placed
    assert all(len({n[:4] for n in seg}) == 1 for seg in plan.segments)
    assert sorted(len(s) for s in plan.segments) == [8, 8, 8]


def test_kueue_best_fit_takes_the_tightest_rack_that_holds_the_job() -> None:
    fleet = Fleet.uniform(3)
    occupy(fleet, "a", 1, list(range(9)))
    plan = place(fleet, gang("g", 8, "required"), "kueue-tas")
    assert plan.racks == ["r001"]


def test_kueue_preferred_spills_over_racks() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(10)))
    occupy(fleet, "b", 1, list(range(10)))
    plan = place(fleet, gang("g", 12, "preferred"), "kueue-tas")
    assert plan.placed and len(plan.racks) == 2


def test_kueue_small_jobs_use_least_free_capacity() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 1, list(range(15)))
    plan = place(fleet, JobRequest("s", num_gpus=1, locality="none"), "kueue-tas")
    assert plan.racks == ["r001"]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_refuses_what_does_not_fit(policy: str) -> None:
    fleet = Fleet.uniform(1)
    plan = place(fleet, gang("g", 19, "none"), policy)
    assert not plan.placed
    assert plan.reason


@pytest.mark.parametrize("policy", POLICIES)
def test_plans_are_json_serialisable_and_give_reasons(policy: str) -> None:
    fleet = Fleet.uniform(2)
    plan = place(fleet, gang("g", 4), policy)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["placed"] and data["reason"] and data["choices"]


def test_mixed_fleets_place_an_eight_gpu_job_on_one_hgx_node() -> None:
    fleet = Fleet.from_shapes([(1, 18, 4, 2), (2, 1, 8, 0)])
    plan = place(fleet, JobRequest("j", num_gpus=8))
    assert plan.placed and len(plan.nodes) == 1
    assert fleet.nodes[next(iter(plan.nodes))].gpus == 8


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError):
        place(Fleet.uniform(1), gang("g", 1), "best")


def test_schedule_reserves_racks_for_a_blocked_gang() -> None:
    fleet = Fleet.uniform(2)
    a = occupy(fleet, "a", 0, list(range(10)))
    b = occupy(fleet, "b", 1, list(range(10)))
    a.expected_end, b.expected_end = 1000.0, 5000.0
    big = gang("big", 14, submit_time=0.0, expected_duration=3600.0)
    long_small = gang("long", 4, submit_time=1.0, expected_duration=10_000.0)
    short_small = gang("short", 4, submit_time=2.0, expected_duration=100.0)
    plan = schedule(fleet, [big, long_small, short_small], now=10.0)
    assert plan.reservation is not None
    assert plan.reservation["racks"] == ["r000"]  # ready first (a ends at 1000)
    assert plan.reservation["start"] == 1000.0
    held = set(plan.reservation["nodes"])
    assert len(held) == 14
    started = {p.job_id: p for p in plan.placements}
    # The long job may not take the reserved nodes; the short one ends in time and may.
    assert "long" in started and not held & set(started["long"].nodes)
    assert "short" in started
    assert "big" in plan.waiting and "reserved" in plan.waiting["big"]


def test_schedule_takes_the_largest_expansion_factor_first() -> None:
    fleet = Fleet.uniform(1)
    occupy(fleet, "a", 0, list(range(8)))
    old_long = gang("long", 10, submit_time=0.0, expected_duration=36_000.0)
    short = gang("short", 10, submit_time=5.0, expected_duration=60.0)
    plan = schedule(fleet, [old_long, short], now=900.0)
    assert [p.job_id for p in plan.placements] == ["short"]
    # Without a clock: plain priority and submit order.
    assert [p.job_id for p in schedule(fleet, [old_long, short]).placements] == ["long"]


def test_schedule_leaves_the_fleet_alone_unless_asked() -> None:
    fleet = Fleet.uniform(1)
    plan = schedule(fleet, [gang("a", 4), gang("b", 4)])
    assert len(plan.placements) == 2
    assert not fleet.allocations
    schedule(fleet, [gang("a", 4)], apply=True)
    assert list(fleet.allocations) == ["a"]
    assert validate(fleet) == []


def test_schedule_reserves_for_the_first_blocked_gang_only() -> None:
    # EASY backfill: one reservation. A second blocked gang waits without one.
    fleet = Fleet.uniform(2)
    a = occupy(fleet, "a", 0, list(range(10)))
    b = occupy(fleet, "b", 1, list(range(10)))
    a.expected_end, b.expected_end = 1000.0, 5000.0
    big1 = gang("big1", 14, submit_time=0.0, expected_duration=3600.0)
    big2 = gang("big2", 14, submit_time=1.0, expected_duration=3600.0)
    plan = schedule(fleet, [big1, big2], now=10.0)
    assert plan.reservation is not None and plan.reservation["job_id"] == "big1"
    assert "reserved" in plan.waiting["big1"] and "reserved" not in plan.waiting["big2"]


def test_what_if_says_where_a_job_would_start_now() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "a", 0, list(range(10)))
    w = what_if(fleet, [], gang("w", 4, submit_time=10.0, expected_duration=60.0), 10.0)
    assert w.plan is not None and w.plan.racks == ["r000"]  # best fit: the busier rack
    assert w.expected_start == 10.0
    assert not fleet.allocations.keys() - {"a"}  # the fleet is not changed


@pytest.mark.parametrize("t0", [0.0, 1.8e9])  # simulator seconds, and epoch seconds
def test_what_if_estimates_the_start_after_the_jobs_ahead(t0: float) -> None:
    # At epoch scale a float's step is 2e-7 s: a start exactly at a job's end must
    # still be found (it was not, when times were compared with a 1e-9 margin).
    fleet = Fleet.uniform(2)
    a = occupy(fleet, "a", 0, list(range(10)))
    b = occupy(fleet, "b", 1, list(range(10)))
    a.expected_end, b.expected_end = t0 + 1000.0, t0 + 5000.0
    job = gang("w", 14, submit_time=t0 + 10.0, expected_duration=3600.0)
    alone = what_if(fleet, [], job, t0 + 10.0)
    assert alone.plan is None and alone.expected_start == t0 + 1000.0  # when a ends
    assert (alone.largest_free, alone.unit) == (8, "nodes")
    ahead = gang("q", 14, submit_time=t0, expected_duration=3600.0)
    behind = what_if(fleet, [ahead], job, t0 + 10.0)
    # q takes r000 from 1000 to 4600; the next 14 nodes free: r000 again at 4600.
    assert behind.expected_start == t0 + 4600.0 and behind.ahead == 1
    unknown = gang("u", 14, submit_time=t0 + 10.0, locality="required")  # no end to plan
    a.expected_end = None
    b.expected_end = None
    assert what_if(fleet, [], unknown, t0 + 10.0).expected_start is None


def test_a_job_held_back_by_a_reservation_says_for_which_job() -> None:
    # a holds 10 nodes of the one rack until t=1000; big (14 nodes) is reserved for
    # then. long would fit the 8 idle nodes now but runs past 1000: it waits, and its
    # reason says the room is held for big, not that no rack offers the nodes.
    fleet = Fleet.uniform(1)
    a = occupy(fleet, "a", 0, list(range(10)))
    a.expected_end = 1000.0
    big = gang("big", 14, submit_time=0.0, expected_duration=3600.0)
    long = gang("long", 6, submit_time=1.0, expected_duration=10_000.0)
    plan = schedule(fleet, [big, long], now=10.0)
    assert plan.reservation is not None and plan.reservation["job_id"] == "big"
    assert plan.waiting["long"] == (
        "the room it needs now is held for job big, expected to start in 990 s; "
        "it would still be running then"
    )
