"""Moving long gangs off racks whose NVLink fabric is degraded
(placement.evacuate): biggest first, each to healthy racks, no two moves on the
same nodes; gangs ending soon, one-node work and gangs with no room stay."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.evacuate import evacuate
from placement.model import Allocation, Fleet, JobRequest
from placement.testing import occupy


def _fleet(racks: int = 3) -> Fleet:
    fleet = Fleet.uniform(racks, 18, 4, spare_nodes=0)
    fleet.degraded = frozenset({fleet.racks[0].id})
    return fleet


def _ends_at(fleet: Fleet, jid: str, end: float) -> None:
    alloc = fleet.release(jid)
    fleet.allocate(replace(alloc, expected_end=end))


def test_long_gangs_move_to_healthy_racks_biggest_first_and_short_ones_stay():
    fleet = _fleet()
    occupy(fleet, "big", 0, list(range(0, 8)))
    occupy(fleet, "small-gang", 0, list(range(8, 12)))
    occupy(fleet, "ending", 0, list(range(12, 14)))
    occupy(fleet, "elsewhere", 1, list(range(0, 16)))
    _ends_at(fleet, "big", 100_000)
    _ends_at(fleet, "ending", 1_000)
    before = fleet.to_dict()
    out = evacuate(fleet, now=0.0, min_remaining_s=3600)
    assert fleet.to_dict() == before, "the fleet is left as it was"
    assert [m.job_id for m in out.moves] == ["big", "small-gang"]
    assert out.stays == {"ending": "ends in 17 min, before a move would pay"}
    healthy = {fleet.racks[1].id, fleet.racks[2].id}
    for move in out.moves:
        assert {fleet.nodes[n].rack for n in move.to_nodes} <= healthy
        assert len({fleet.nodes[n].rack for n in move.to_nodes}) == 1, "rack-local"
        assert move.cost_gpu_hours > 0
    # The 8-node gang takes rack 2 (rack 1 holds 2 idle nodes); the 4-node one fits rack 1's.
    assert not set(out.moves[0].to_nodes) & set(out.moves[1].to_nodes)


def test_one_node_work_and_gangs_elsewhere_are_left_alone():
    fleet = _fleet()
    fleet.allocate(
        Allocation(JobRequest("one", num_gpus=2), {fleet.node_at(fleet.racks[0].id, 0).id: (0, 1)})
    )
    occupy(fleet, "g", 1, list(range(4)))
    assert evacuate(fleet, now=0.0).moves == []
    fleet.degraded = frozenset()
    occupy(fleet, "h", 0, list(range(4, 8)))
    assert evacuate(fleet, now=0.0).moves == [], "no degraded rack: nothing to do"


def test_a_gang_with_no_room_on_a_healthy_rack_stays_saying_why():
    fleet = _fleet(2)
    occupy(fleet, "g", 0, list(range(10)))
    occupy(fleet, "full", 1, list(range(10)))
    out = evacuate(fleet, now=0.0)
    assert out.moves == []
    assert out.stays["g"].startswith("no room on a healthy rack: ")


def test_jobs_in_an_open_plan_are_skipped():
    fleet = _fleet()
    occupy(fleet, "g", 0, list(range(4)))
    assert evacuate(fleet, now=0.0, skip=frozenset({"g"})).moves == []


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(2, 12), min_size=1, max_size=6))
def test_moves_never_overlap_never_touch_the_degraded_rack_and_take_only_free_nodes(sizes):
    fleet = Fleet.uniform(3, 18, 4, spare_nodes=0)
    # Gangs on racks 0 and 1 as they fit; rack 0 degraded.
    placed: list[str] = []
    for i, n in enumerate(sizes):
        for r in range(2):
            rack = fleet.racks[r]
            free = sorted(rack.free)
            if len(free) >= n:
                occupy(fleet, f"j{i}", r, free[:n])
                placed.append(f"j{i}")
                break
    fleet.degraded = frozenset({fleet.racks[0].id})
    on_bad = {
        j for j in placed if any(fleet.nodes[n].rack == fleet.racks[0].id for n in fleet.allocations[j].nodes)
    }
    out = evacuate(fleet, now=0.0)
    assert {m.job_id for m in out.moves} | set(out.stays) == on_bad
    claimed: set[str] = set()
    for move in out.moves:
        targets = set(move.to_nodes)
        assert not targets & claimed
        claimed |= targets
        for n in targets:
            node = fleet.nodes[n]
            assert node.rack != fleet.racks[0].id
            assert node.used == 0, "only idle nodes"
    # Oracle: a gang that stays found no room, even after the moves before it.
    for jid, why in out.stays.items():
        assert why.startswith("no room on a healthy rack")
        need = len(fleet.allocations[jid].nodes)
        assert all(
            len(set(r.free) - {fleet.nodes[c].index for c in claimed if fleet.nodes[c].rack == r.id}) < need
            for r in fleet.racks[1:]
        )


def test_a_job_on_a_flagged_node_has_it_swapped_in_its_rack_and_others_are_left_alone():
    fleet = Fleet.uniform(2, 18, 4, spare_nodes=2)
    occupy(fleet, "g", 0, list(range(8)))
    occupy(fleet, "other", 0, list(range(8, 12)))
    flagged = fleet.node_at(fleet.racks[0].id, 2).id
    out = evacuate(fleet, flagged=frozenset({flagged}), now=0.0)
    [move] = out.moves
    assert move.job_id == "g" and flagged not in move.to_nodes
    assert {fleet.nodes[n].rack for n in move.to_nodes} == {fleet.racks[0].id}, "swapped in place"
    assert set(move.from_nodes) - set(move.to_nodes) == {flagged}
    assert out.stays == {}


def test_a_small_job_on_a_flagged_node_moves_to_another_node():
    fleet = Fleet.uniform(1, 18, 4, spare_nodes=2)
    node = fleet.node_at(fleet.racks[0].id, 0)
    fleet.allocate(Allocation(JobRequest("s", num_gpus=2), {node.id: (0, 1)}))
    [move] = evacuate(fleet, flagged=frozenset({node.id}), now=0.0).moves
    assert node.id not in move.to_nodes and sum(len(g) for g in move.to_nodes.values()) == 2
