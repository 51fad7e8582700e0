"""Defragmentation plans: cheapest moves, never a non-preemptible job, budgets."""

from __future__ import annotations

import dataclasses
import json

from placement.defrag import FreeRacks, RoomFor, _room_elsewhere, defragment
from placement.model import Allocation, Fleet, JobRequest
from placement.place import place
from placement.testing import gang, occupy
from placement.validate import validate


def _scattered() -> Fleet:
    """Three racks: two hold 8+4 busy nodes, the third two 4-node jobs. No rack can
    take a 12-node gang (it needs 12 idle nodes plus 2 spares)."""
    fleet = Fleet.uniform(3)
    for r in range(2):
        occupy(fleet, f"big{r}", r, list(range(8)))
        occupy(fleet, f"small{r}", r, [8, 9, 10, 11])
    occupy(fleet, "small2", 2, [0, 1, 2, 3])
    occupy(fleet, "small3", 2, [4, 5, 6, 7])
    return fleet


def _apply(fleet: Fleet, plan_moves: list) -> None:  # type: ignore[type-arg]
    for m in plan_moves:
        old = fleet.release(m.job_id)
        fleet.allocate(Allocation(old.job, dict(m.to_nodes), m.to_segments))


def test_it_makes_room_for_a_pending_gang_with_the_cheapest_moves() -> None:
    fleet = _scattered()
    plan = defragment(fleet, [gang("wanted", 12)])
    assert plan.feasible
    assert plan.jobs_made_placeable == ["wanted"]
    # 12 nodes plus 2 spares: moving one 4-node job out of r002 is enough.
    assert len(plan.moves) == 1
    assert plan.moves[0].job_id in ("small2", "small3")
    assert all(r != "r002" for r in {n[:4] for n in plan.moves[0].to_nodes})
    assert plan.cost_gpu_hours == plan.moves[0].cost_gpu_hours > 0
    _apply(fleet, plan.moves)
    assert validate(fleet) == []


def test_it_never_moves_a_non_preemptible_job() -> None:
    fleet = Fleet.uniform(2)
    occupy(fleet, "pinned0", 0, list(range(10)), preemptible=False)
    occupy(fleet, "pinned1", 1, list(range(10)), preemptible=False)
    plan = defragment(fleet, [gang("wanted", 14)])
    assert not plan.feasible
    assert plan.moves == []


def test_it_honours_the_budget() -> None:
    fleet = _scattered()
    assert defragment(fleet, [gang("wanted", 16)]).feasible
    poor = defragment(fleet, [gang("wanted", 16)], budget_gpu_hours=1.0)
    assert not poor.feasible and poor.moves == []
    assert "budget" in poor.reason
    no_moves = defragment(fleet, [gang("wanted", 16)], max_moves=1)
    assert not no_moves.feasible


def test_it_can_free_whole_racks() -> None:
    fleet = _scattered()
    plan = defragment(fleet, target=FreeRacks(1))
    assert plan.feasible
    assert plan.free_racks_before == 0 and plan.free_racks_after == 1
    _apply(fleet, plan.moves)
    assert sum(1 for r in fleet.racks if r.free_count == 18) == 1


def test_it_reports_fragmentation_before_and_after() -> None:
    fleet = _scattered()
    plan = defragment(fleet, target=RoomFor(16))
    assert plan.feasible
    assert plan.fragmentation_after < plan.fragmentation_before
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["moves"] and all(m["reason"] for m in data["moves"])


def test_without_figures_it_plans_the_same_moves_and_reports_no_figures() -> None:
    with_figures = defragment(_scattered(), [gang("wanted", 16)])
    plan = defragment(_scattered(), [gang("wanted", 16)], figures=False)
    assert with_figures.moves and with_figures.fragmentation_before > 0
    assert plan.to_dict() == {
        **with_figures.to_dict(),
        "fragmentation_before": 0.0,
        "fragmentation_after": 0.0,
        "free_racks_before": 0,
        "free_racks_after": 0,
    }


def test_nothing_to_do_is_a_feasible_empty_plan() -> None:
    plan = defragment(Fleet.uniform(2), [gang("wanted", 16)])
    assert plan.feasible and plan.moves == []


def test_planning_leaves_the_fleet_unchanged() -> None:
    fleet = _scattered()
    before = fleet.to_dict()
    defragment(fleet, target=FreeRacks(2))
    assert fleet.to_dict() == before


def _plan_in_a_small_process(target: str) -> str:
    """Plan ``target`` on a two-rack fleet in a child limited to 1 GB, so that a
    planner sizing a list by the target fails there (MemoryError) and not here."""
    import subprocess
    import sys

    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from placement.defrag import FreeRacks, RoomFor, defragment\n"
        "from placement.model import Fleet\n"
        f"plan = defragment(Fleet.uniform(2), target={target})\n"
        "print(plan.feasible, len(plan.moves), plan.reason)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-500:]
    return done.stdout.strip()


def test_a_huge_whole_rack_target_makes_no_goal_per_rack_asked_for() -> None:
    # free_racks=2^56 once grew the web process to 22 GB: one goal per rack asked for.
    out = _plan_in_a_small_process("FreeRacks(72057594037927936)")
    assert out.startswith("False 0 ") and "the fleet has 2 racks" in out


def test_room_for_more_nodes_than_the_fleet_holds_is_infeasible_at_once() -> None:
    # room_for_nodes=10^13 made a list of 10^13 / 18 segments (MemoryError).
    out = _plan_in_a_small_process("RoomFor(10_000_000_000_000)")
    assert out.startswith("False 0 ") and "the fleet has 36 nodes of 4 GPUs" in out


def test_a_target_just_beyond_the_fleet_says_what_it_has() -> None:
    plan = defragment(Fleet.uniform(2), target=FreeRacks(3))
    assert not plan.feasible and plan.moves == []
    assert "cannot be met: the fleet has 2 racks, 2 already whole" in plan.reason


def _small(fleet: Fleet, jid: str, node_id: str, gpus: int, preemptible: bool = True) -> None:
    """A job of ``gpus`` GPUs on the lowest free GPUs of one node."""
    node = fleet.nodes[node_id]
    job = JobRequest(jid, num_gpus=gpus, preemptible=preemptible)
    fleet.allocate(Allocation(job, {node_id: node.free_indices(gpus)}, [[node_id]]))


def _scattered_small(preemptible: bool = True) -> Fleet:
    """Two racks, no node with 4 free GPUs: each node of r000 holds two 1-GPU jobs
    (making room there takes 2 moves), each node of r001 a 1-GPU and a 2-GPU job (2
    dearer moves), except r001-n07: a single 3-GPU job (1 move, but no other node has
    3 free GPUs for it). The fewest moves that work: 2, off an r000 node."""
    fleet = Fleet.uniform(2)
    for node in fleet.racks[0].nodes:
        for k in range(2):
            _small(fleet, f"{node.id}-a{k}", node.id, 1, preemptible)
    for node in fleet.racks[1].nodes:
        if node.index == 7:
            _small(fleet, f"{node.id}-c", node.id, 3, preemptible)
            continue
        _small(fleet, f"{node.id}-a", node.id, 1, preemptible)
        _small(fleet, f"{node.id}-b", node.id, 2, preemptible)
    return fleet


def test_it_consolidates_small_jobs_so_that_a_one_node_job_fits() -> None:
    fleet = _scattered_small()
    wanted = JobRequest("wanted", num_gpus=4)
    assert not place(fleet, wanted).placed
    plan = defragment(fleet, [wanted])
    assert plan.feasible, plan.reason
    assert plan.jobs_made_placeable == ["wanted"]
    # The figure is for the typical multi-node job (a 16-node slice here): one
    # node made whole helps the 4-GPU job, not that one.
    assert plan.fragmentation_before == 1.0 == plan.fragmentation_after
    # 1 move (the 3-GPU job) has nowhere to go; 2 moves off an r000 node is the fewest
    # (and the cheapest of those: two 1-GPU jobs, not a 1-GPU and a 2-GPU one).
    assert len(plan.moves) == 2
    froms = {n for m in plan.moves for n in m.from_nodes}
    assert froms == {"r000-n00"}
    assert all(n not in froms for m in plan.moves for n in m.to_nodes)
    assert plan.cost_gpu_hours == sum(m.cost_gpu_hours for m in plan.moves) > 0
    _apply(fleet, plan.moves)
    assert validate(fleet) == []
    placed = place(fleet, wanted)
    assert placed.placed and list(placed.nodes) == list(froms)
    assert validate(fleet, placed, job=wanted) == []


def test_one_move_is_enough_when_a_node_is_one_small_job_short() -> None:
    fleet = _scattered_small()
    spare = fleet.nodes["r001-n03"]
    fleet.release("r001-n03-b")  # r001-n03: one 1-GPU job, 3 GPUs free
    assert spare.free_gpus == 3
    plan = defragment(fleet, [JobRequest("wanted", num_gpus=4)])
    assert plan.feasible and [m.job_id for m in plan.moves] == ["r001-n03-a"]
    _apply(fleet, plan.moves)
    assert validate(fleet) == [] and spare.free_gpus == 4


def test_it_says_so_when_only_non_preemptible_small_jobs_are_in_the_way() -> None:
    fleet = _scattered_small(preemptible=False)
    plan = defragment(fleet, [JobRequest("wanted", num_gpus=4)])
    assert not plan.feasible and plan.moves == [] and plan.jobs_made_placeable == []
    assert "nothing to do" not in plan.reason
    assert "no node can be given 4 free GPUs by moving small preemptible jobs" in plan.reason


def test_it_says_so_when_the_small_jobs_have_nowhere_to_go() -> None:
    # Four nodes, each a 2-GPU and a 1-GPU job: 4 GPUs free in all, but emptying a
    # node means moving a 2-GPU job, and no other node has 2 free GPUs.
    fleet = Fleet.uniform(1, nodes_per_rack=4, spare_nodes=0)
    for node in fleet.racks[0].nodes:
        _small(fleet, f"{node.id}-b", node.id, 2)
        _small(fleet, f"{node.id}-a", node.id, 1)
    before = fleet.to_dict()
    plan = defragment(fleet, [JobRequest("wanted", num_gpus=4)])
    assert not plan.feasible and plan.moves == []
    assert "nowhere else to go" in plan.reason
    assert fleet.to_dict() == before


def test_too_few_free_gpus_for_a_one_node_job_is_reported() -> None:
    fleet = Fleet.uniform(1, nodes_per_rack=2, spare_nodes=0)
    for node in fleet.racks[0].nodes:
        for k in range(3):
            _small(fleet, f"{node.id}-a{k}", node.id, 1)
    plan = defragment(fleet, [JobRequest("wanted", num_gpus=4)])
    assert not plan.feasible and plan.moves == []
    assert "only 2 GPUs are free on 4-GPU nodes, 4 needed" in plan.reason


def test_a_one_node_goal_honours_the_move_budget() -> None:
    fleet = _scattered_small()
    plan = defragment(fleet, [JobRequest("wanted", num_gpus=4)], max_moves=1)
    assert not plan.feasible and plan.moves == [] and "budget" in plan.reason


def test_a_segmented_gang_needs_room_in_whole_segments_to_move_out() -> None:
    # 8 nodes in segments of 4, on racks r000 and r003 (both avoided): r001 and r002
    # have 6 + 2 idle nodes, enough nodes but room for one segment only.
    fleet = Fleet.uniform(4)
    occupy(fleet, "busy1", 1, list(range(12)))
    occupy(fleet, "busy2", 2, list(range(16)))
    r0, r3 = fleet.racks[0], fleet.racks[3]
    nodes = {fleet.node_at(r.id, i).id: (0, 1, 2, 3) for r in (r0, r3) for i in range(4)}
    seg = Allocation(
        JobRequest("seg", num_gpus=32, segment_nodes=4, locality="required"),
        nodes,
        [list(nodes)[:4], list(nodes)[4:]],
    )
    fleet.allocate(seg)
    avoid = {r0.id, r3.id}
    assert not _room_elsewhere(fleet, seg, avoid, 2)
    with fleet.trial():
        fleet.release("seg")
        assert not place(fleet, seg.job, exclude=avoid).placed
    whole = Allocation(dataclasses.replace(seg.job, segment_nodes=None), nodes, [list(nodes)])
    assert _room_elsewhere(fleet, whole, avoid, 2)  # without segments 6 + 2 would do
