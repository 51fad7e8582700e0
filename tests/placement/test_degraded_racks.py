"""Racks whose NVLink fabric is degraded (``Fleet.degraded``): no new multi-node
gang goes there, through place(), the queue pass and recovery's moves; one-node
work still may."""

from __future__ import annotations

import pytest

from placement.model import Fleet, JobRequest
from placement.place import place, schedule
from placement.recover import recover
from placement.testing import gang, occupy


def _fleet() -> Fleet:
    fleet = Fleet.uniform(2, 18, 4, spare_nodes=0)
    occupy(fleet, "x", 1, list(range(8)))  # best fit for an 8-node gang: rack 1
    fleet.degraded = frozenset({fleet.racks[1].id})
    return fleet


def test_a_gang_keeps_off_a_degraded_rack_and_one_node_work_does_not():
    fleet = _fleet()
    plan = place(fleet, gang("g", 8, "required"))
    assert plan.placed and set(plan.racks) == {fleet.racks[0].id}
    small = place(fleet, JobRequest("s", num_gpus=4))
    assert small.placed and set(small.racks) == {fleet.racks[1].id}, "packed into the busy rack"


def test_a_gang_that_only_a_degraded_rack_could_hold_waits_saying_so():
    fleet = _fleet()
    occupy(fleet, "y", 0, list(range(12)))
    plan = place(fleet, gang("g", 8, "required"))
    assert not plan.placed
    assert plan.reason.endswith(f"; gangs are kept off {fleet.racks[1].label} (NVLink fabric degraded)")


@pytest.mark.parametrize("now", [None, 0.0], ids=["best-effort", "backfill"])
def test_the_queue_pass_keeps_gangs_off_degraded_racks(now):
    fleet = _fleet()
    out = schedule(fleet, [gang("g1", 8, "required"), gang("g2", 12, "required")], now=now)
    assert [p.job_id for p in out.placements] == ["g2"]
    assert {r for p in out.placements for r in p.racks} == {fleet.racks[0].id}
    assert "NVLink fabric degraded" in out.waiting["g1"], "rack 1's 10 idle nodes are not for gangs"


def test_recovery_moves_a_gang_off_a_degraded_rack_instead_of_swapping_into_it():
    fleet = Fleet.uniform(2, 18, 4, spare_nodes=0)
    occupy(fleet, "g", 1, list(range(8)))
    fleet.degraded = frozenset({fleet.racks[1].id})
    failed = fleet.node_at(fleet.racks[1].id, 0).id
    plan = recover(fleet, "g", [failed])
    assert plan.action == "move", plan.steps
    assert {fleet.nodes[n].rack for n in plan.new_nodes} == {fleet.racks[0].id}
    assert plan.steps[0] == f"no swap into {fleet.racks[1].label}: NVLink fabric degraded"
    # The same failure on a healthy rack is swapped in place.
    fleet.degraded = frozenset()
    assert recover(fleet, "g", [failed]).action == "swap"


def test_a_whole_node_job_of_one_node_may_still_go_to_a_degraded_rack():
    fleet = _fleet()
    plan = place(fleet, JobRequest("one", num_nodes=1, gpus_per_node=4))
    assert plan.placed and set(plan.racks) == {fleet.racks[1].id}, "packed into the busy rack"
