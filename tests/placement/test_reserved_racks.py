"""Whole racks reserved for a tenant (``Fleet.reservations``): its work goes there
first, other tenants' only when nothing else holds it, and its reclaims take
back its own NVLink domains first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as S

from placement.model import Fleet, JobRequest
from placement.place import place, schedule
from placement.reclaim import reclaim
from placement.testing import gang, occupy


def _fleet(reserved: dict[int, str]) -> Fleet:
    fleet = Fleet.uniform(3, 18, 4, spare_nodes=0)
    fleet.reservations = {fleet.racks[i].id: t for i, t in reserved.items()}
    return fleet


def _racks(fleet: Fleet, plan) -> set[int]:
    return {fleet.racks.index(fleet.rack_by_id[fleet.nodes[n].rack]) for n in plan.nodes}


def test_a_tenants_gang_goes_to_its_reserved_rack_before_a_better_fit_elsewhere():
    fleet = _fleet({2: "llm"})
    occupy(fleet, "x", 0, list(range(10)), tenant="vision")  # best fit for 8 nodes: rack 0
    assert _racks(fleet, place(fleet, gang("v", 8, "required", tenant="vision"))) == {0}
    assert _racks(fleet, place(fleet, gang("l", 8, "required", tenant="llm"))) == {2}


def test_another_tenants_reserved_rack_is_lent_only_when_nothing_else_holds_the_job():
    fleet = _fleet({2: "llm"})
    assert _racks(fleet, place(fleet, gang("v", 16, "required", tenant="vision"))) != {2}
    assert _racks(fleet, place(fleet, JobRequest("s", num_gpus=1, tenant="vision"))) != {2}
    occupy(fleet, "x", 0, list(range(10)), tenant="vision")
    occupy(fleet, "y", 1, list(range(10)), tenant="vision")
    lent = place(fleet, gang("v", 16, "required", tenant="vision"))
    assert lent.placed and _racks(fleet, lent) == {2}, "the idle reserved rack is lent"


def test_a_reservation_never_makes_a_job_span_more_racks_than_the_fleet_would():
    fleet = _fleet({0: "llm"})
    occupy(fleet, "x", 0, list(range(12)), tenant="vision")  # 6 idle in llm's rack
    # 12 nodes, preferred: one other rack holds it whole; llm's own rack would spill.
    assert len(place(fleet, gang("l", 12, tenant="llm")).racks) == 1


@pytest.mark.parametrize("now", [None, 0.0], ids=["best-effort", "backfill"])
def test_the_queue_pass_follows_reservations(now):
    fleet = _fleet({1: "llm"})
    jobs = [gang("l", 8, "required", tenant="llm"), gang("v", 8, "required", tenant="vision")]
    out = schedule(fleet, jobs, now=now)
    where = {p.job_id: _racks(fleet, p) for p in out.placements}
    assert where == {"l": {1}, "v": {0}}


def test_an_owners_reclaim_takes_back_its_reserved_rack_before_a_cheaper_one():
    fleet = _fleet({2: "llm"})
    for r in range(3):
        for k in range(4):
            occupy(
                fleet, f"a{r}{k}", r, list(range(4 * k, 4 * k + 4)), tenant="vision", checkpoint_minutes=60
            )
    for vid, alloc in fleet.allocations.items():
        alloc.started_at = 0.0 if vid.startswith("a0") else 1000.0  # rack 0: the cheapest
    job = gang("l", 16, "required", tenant="llm")
    plan = reclaim(fleet, job, lambda v: v.tenant == "vision", {"vision": 10_000}, now=3600.0)
    assert plan.placed and _racks(fleet, plan.placement) == {2}
    assert all(v.startswith("a2") for v in plan.victims)
    # Without the reservation the cheapest rack wins.
    fleet.reservations = {}
    assert all(v.startswith("a0") for v in reclaim(fleet, job, lambda v: True, {}, now=3600.0).victims)


@settings(max_examples=80, deadline=None)
@given(
    reserved=S.dictionaries(S.integers(0, 2), S.sampled_from(["a", "b"]), max_size=3),
    used=S.lists(S.integers(0, 18), min_size=3, max_size=3),
    nodes=S.integers(1, 20),
    tenant=S.sampled_from(["a", "b", "c"]),
    locality=S.sampled_from(["required", "preferred"]),
)
def test_reservations_change_where_a_job_goes_never_whether_it_goes(reserved, used, nodes, tenant, locality):
    fleet = _fleet(reserved)
    for r, n in enumerate(used):
        if n:
            occupy(fleet, f"x{r}", r, list(range(n)), tenant="z")
    with_them = place(fleet, gang("j", nodes, locality, tenant=tenant))
    fleet.reservations = {}
    without = place(fleet, gang("j", nodes, locality, tenant=tenant))
    assert with_them.placed == without.placed
    if with_them.placed:
        assert len(with_them.racks) == len(without.racks)
