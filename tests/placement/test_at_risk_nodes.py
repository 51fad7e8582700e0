"""Nodes at risk (``Rack.at_risk``: a GPU with a suspect verdict, such as a
hardware slowdown or an error rate rising below the drain threshold): gangs and
recovery's swaps take other idle nodes first, and use them only when needed.
Being at risk changes which nodes of a rack a job gets, never whether it is
placed or which racks it uses."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.model import Fleet
from placement.place import place
from placement.recover import recover
from placement.testing import gang, occupy


def _slots(fleet: Fleet, nodes) -> set[int]:
    return {fleet.nodes[n].index for n in nodes}


def test_a_gang_takes_the_healthy_nodes_first_and_the_ones_at_risk_only_when_needed():
    fleet = Fleet.uniform(1, 18, 4, spare_nodes=2)
    rack = fleet.racks[0]
    rack.at_risk = frozenset({0, 1, 2})
    plan = place(fleet, gang("g", 8, "required"))
    assert plan.placed and _slots(fleet, plan.nodes) == set(range(3, 11))
    plan = place(fleet, gang("big", 16, "required"))
    assert plan.placed and _slots(fleet, plan.nodes) == set(range(3, 18)) | {0}, "only one node at risk taken"


def test_recovery_swaps_in_a_healthy_idle_node_before_one_at_risk():
    fleet = Fleet.uniform(1, 18, 4, spare_nodes=2)
    occupy(fleet, "g", 0, list(range(8)))
    fleet.racks[0].at_risk = frozenset({8, 9})
    failed = fleet.node_at(fleet.racks[0].id, 3).id
    plan = recover(fleet, "g", [failed])
    assert plan.action == "swap"
    assert _slots(fleet, plan.swaps.values()) == {10}


def test_at_risk_survives_a_copy_and_a_json_round_trip():
    fleet = Fleet.uniform(2, 18, 4)
    fleet.racks[1].at_risk = frozenset({4})
    assert fleet.copy().racks[1].at_risk == {4}
    assert Fleet.from_dict(fleet.to_dict()).racks[1].at_risk == {4}
    assert "at_risk" not in fleet.to_dict()["racks"][0], "unchanged dicts for fleets with none"


@settings(max_examples=60, deadline=None)
@given(
    busy=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12)), max_size=4),
    risky=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 17)), max_size=12),
    nodes=st.integers(2, 40),
    segment=st.sampled_from([None, 4, 8]),
)
def test_at_risk_changes_which_nodes_never_whether_or_which_racks(busy, risky, nodes, segment):
    fleet = Fleet.uniform(3, 18, 4, spare_nodes=2)
    for i, (rack, count) in enumerate(busy):
        free = sorted(fleet.racks[rack].free)
        if len(free) >= count:
            occupy(fleet, f"b{i}", rack, free[:count])
    job = gang("j", nodes, "preferred", segment_nodes=segment)
    plain = place(fleet, job)
    for r in range(3):
        fleet.racks[r].at_risk = frozenset(s for rr, s in risky if rr == r)
    aware = place(fleet, replace(job))
    assert aware.placed == plain.placed
    if plain.placed:
        per_rack = lambda p: sorted(  # noqa: E731
            (fleet.nodes[n].rack, sum(1 for m in p.nodes if fleet.nodes[m].rack == fleet.nodes[n].rack))
            for n in p.nodes
        )
        assert per_rack(aware) == per_rack(plain)
        # Oracle: no idle healthy node left out while one at risk was taken, rack by rack.
        for rack in fleet.racks:
            taken = {fleet.nodes[n].index for n in aware.nodes if fleet.nodes[n].rack == rack.id}
            if taken & rack.at_risk:
                assert (rack.free - rack.at_risk) <= taken
