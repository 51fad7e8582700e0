"""rackwise against an exhaustive oracle (placement.oracle) on small fleets.

Whenever some assignment is valid under the policy's rules, place() finds one, on
the fewest racks, that the oracle and the invariant checker both accept; when
place() says the job waits, no assignment is valid and the reason's figures are
true of the fleet. what_if() agrees with place() and its "largest free slice" is
the fleet's.

Fleets: up to 4 racks of 2-8 nodes, 4- and 8-GPU nodes (one or two shape groups),
spares, failed and draining nodes, whole-node gangs and partly used nodes, some
preemptible. Jobs: single-node, gangs by GPUs or by nodes, segments (also larger
than the job or a rack), every locality, with and without a clock, reserved and
excluded racks.
"""

from __future__ import annotations

import os
import random
import re

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from placement import oracle
from placement.model import Allocation, Fleet, JobRequest, Node, Rack
from placement.place import place, what_if
from placement.testing import occupy
from placement.validate import validate

SETTINGS = settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", "500")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow],
)
NOW = 10_000.0


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    """Up to 4 racks; each a size, a GPU count per node and a spare count; then
    jobs on some nodes (whole nodes or a few GPUs), then failures and drains."""
    count = draw(st.integers(1, 4))
    racks: list[Rack] = []
    for i in range(count):
        size = draw(st.integers(2, 8))
        gpn = draw(st.sampled_from([4, 4, 8]))
        spares = draw(st.integers(0, min(2, size - 1)))
        rid = f"r{i}"
        racks.append(Rack(rid, [Node(f"{rid}-n{j}", rid, j, gpn) for j in range(size)], spare_nodes=spares))
    fleet = Fleet(racks)
    rng = random.Random(draw(st.integers(0, 10**6)))
    busy = draw(st.floats(0.0, 0.6))
    for rack in fleet.racks:
        for node in rack.nodes:
            if rng.random() >= busy:
                continue
            pre = rng.random() < 0.5
            if rng.random() < 0.6:
                job = JobRequest(f"w-{node.id}", num_nodes=1, gpus_per_node=node.gpus, preemptible=pre)
                gpus = tuple(range(node.gpus))
            else:
                g = rng.randint(1, node.gpus - 1)
                job = JobRequest(f"s-{node.id}", num_gpus=g, preemptible=pre)
                gpus = tuple(range(g))
            fleet.allocate(Allocation(job, {node.id: gpus}, [[node.id]]))
    for node in list(fleet.nodes.values()):
        roll = rng.random()
        if roll < 0.08:
            fleet.set_health(node.id, "failed")
        elif roll < 0.14:
            fleet.set_health(node.id, "draining")
    return fleet


@st.composite
def jobs(draw: st.DrawFn) -> JobRequest:
    kind = draw(st.sampled_from(["small", "gpus", "nodes", "nodes", "nodes"]))
    # Short segments often: they are the ones that may spread over racks.
    seg = draw(st.one_of(st.none(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 10)))
    common = {
        "locality": draw(st.sampled_from(["required", "preferred", "none"])),
        "preemptible": draw(st.booleans()),
        "submit_time": draw(st.sampled_from([None, 0.0, NOW - 60])),
        "expected_duration": draw(st.sampled_from([None, 600.0, 36000.0])),
    }
    if kind == "small":
        return JobRequest("j", num_gpus=draw(st.integers(1, 8)), **common)
    if kind == "gpus":
        return JobRequest("j", num_gpus=draw(st.integers(5, 48)), segment_nodes=seg, **common)
    return JobRequest(
        "j",
        num_nodes=draw(st.integers(1, 12)),
        gpus_per_node=draw(st.sampled_from([4, 8])),
        segment_nodes=seg,
        **common,
    )


@st.composite
def options(draw: st.DrawFn, fleet: Fleet) -> dict[str, object]:
    ids = [r.id for r in fleet.racks]
    out: dict[str, object] = {"now": draw(st.sampled_from([None, NOW]))}
    if draw(st.booleans()):
        out["reserved"] = draw(st.lists(st.sampled_from(ids), unique=True, max_size=2))
        out["reserved_until"] = draw(st.sampled_from([None, NOW + 1000.0, NOW + 10**6]))
    if draw(st.integers(0, 3)) == 0:
        out["exclude"] = draw(st.lists(st.sampled_from(ids), unique=True, max_size=1))
    return out


def one_shape(fleet: Fleet) -> bool:
    return len(fleet.groups) == 1


def check_reason(fleet: Fleet, job: JobRequest, reason: str, kw: dict[str, object]) -> None:
    """The figures a refusal gives are the fleet's (where the oracle can recount them)."""
    if not one_shape(fleet) or kw.get("exclude"):
        return
    gpn = next(iter(fleet.groups))
    reserved = kw.get("reserved", ()) if not _cleared(job, kw) else ()
    for m in re.finditer(
        r"(the racks with the most idle nodes have|the racks offer) room for "
        r"(\d+) of its (\d+) segments",
        reason,
    ):
        got, pieces = oracle.segments_room(
            fleet,
            job,
            gpn,
            reserved=reserved,  # type: ignore[arg-type]
            idle_only=m.group(1).startswith("the racks with"),
        )
        assert (int(m.group(2)), int(m.group(3))) == (got, pieces), reason
    m = re.search(r"no rack offers (\d+) idle nodes", reason)
    if m:
        ans = oracle.solve(fleet, job, **kw)  # type: ignore[arg-type]
        offers = [rr.offer for g in ans.groups for rr in g.racks]
        assert max(offers, default=0) < int(m.group(1)), reason


def _cleared(job: JobRequest, kw: dict[str, object]) -> bool:
    until, now = kw.get("reserved_until"), kw.get("now")
    return (
        until is not None
        and now is not None
        and job.expected_duration is not None
        and now + job.expected_duration <= until
    )  # type: ignore[operator]


def demo_fleet(preemptible_neighbours: bool = False) -> Fleet:
    """The live demo: 8 NVL72 racks (18 nodes, 2 spares), 7-8 idle nodes each."""
    fleet = Fleet.uniform(8)
    for i in range(8):
        occupy(fleet, f"busy{i}", i, list(range(10 + i % 2)), preemptible=preemptible_neighbours)
    return fleet


@given(st.data())
@SETTINGS
@example(data=None)  # the demo case, below
def test_place_finds_a_placement_whenever_the_oracle_does(data) -> None:
    if data is None:
        fleet = demo_fleet()
        job = JobRequest(
            "j",
            num_nodes=12,
            gpus_per_node=4,
            segment_nodes=6,
            locality="required",
            preemptible=False,
            submit_time=0.0,
            expected_duration=3600.0,
        )
        kw: dict[str, object] = {"now": NOW}
    else:
        fleet = data.draw(fleets())
        job = data.draw(jobs())
        kw = data.draw(options(fleet))
    ans = oracle.solve(fleet, job, **kw)  # type: ignore[arg-type]
    plan = place(fleet, job, **kw)  # type: ignore[arg-type]
    kind = (
        "small"
        if not any(g.nodes for g in ans.groups)
        else "segments"
        if any(len(g.pieces) > 1 for g in ans.groups)
        else "gang"
    )
    event(f"{kind}, {'fits' if ans.feasible else 'waits'} in {ans.fewest_racks} rack(s)")
    if ans.feasible:
        assert plan.placed, f"the oracle found {ans.fewest_racks} rack(s); place(): {plan.reason}"
    if plan.placed:
        # The new allocation against the fleet (jobs already on failed nodes are
        # recovery's business, not this plan's).
        assert validate(fleet, {job.id: plan.allocation(job)}) == []
        assert oracle.check_plan(fleet, job, plan, **kw) == [], plan.to_dict()  # type: ignore[arg-type]
        assert len(plan.racks) == ans.fewest_racks, (plan.racks, ans.fewest_racks)
        gangs = [g for g in ans.groups if g.nodes]
        if len(plan.racks) == 1 and len(gangs) == 1 and len(ans.groups) == 1:
            # Best fit: of the racks that hold it alone, the one offering the fewest.
            offers = {rr.rack.id: rr.offer for rr in gangs[0].racks}
            assert offers[plan.racks[0]] == min(o for o in offers.values() if o >= gangs[0].nodes)
    else:
        assert not ans.feasible
        check_reason(fleet, job, plan.reason, kw)


@given(st.data())
@SETTINGS
def test_what_if_agrees_with_the_oracle_and_its_figure_is_the_fleets(data) -> None:
    fleet = data.draw(fleets())
    job = data.draw(jobs())
    job = JobRequest(**{**job.to_dict(), "submit_time": NOW})
    answer = what_if(fleet, [], job, NOW)
    ans = oracle.solve(fleet, job, now=NOW)
    assert (answer.plan is not None) == ans.feasible, answer.reason
    assert (answer.largest_free, answer.unit) == oracle.largest_free(fleet, job)
    if answer.plan is None:
        # A gang that waits for room in whole segments, or in one rack: the
        # figure must not say the room is there.
        for g in ans.groups:
            if g.nodes and not g.split_freely:
                assert answer.largest_free < g.nodes or len(fleet.groups) > 1, answer.reason


@pytest.mark.parametrize("locality", ["required", "preferred", "none"])
@pytest.mark.parametrize("preemptible", [False, True])
def test_the_demo_case_is_placed_in_whole_segments_and_what_if_says_now(locality, preemptible):
    fleet = demo_fleet()
    job = JobRequest(
        "j",
        num_nodes=12,
        gpus_per_node=4,
        segment_nodes=6,
        locality=locality,
        preemptible=preemptible,
        submit_time=NOW,
        expected_duration=3600.0,
    )
    plan = place(fleet, job, now=NOW)

    assert plan.placed, plan.reason
    assert len(plan.racks) == 2 and sorted(map(len, plan.segments)) == [6, 6]
    assert validate(fleet, plan, job=job) == []
    assert what_if(fleet, [], job, NOW).plan is not None


def test_a_segmented_gang_that_waits_says_how_many_segments_there_is_room_for():
    fleet = Fleet.uniform(8)
    for i in range(8):  # 7 idle nodes in every rack: 5 offered, spares kept
        occupy(fleet, f"busy{i}", i, list(range(11)), preemptible=False)
    job = JobRequest("j", num_nodes=12, gpus_per_node=4, segment_nodes=6, preemptible=False)
    plan = place(fleet, job)

    assert not plan.placed
    assert "the racks offer room for 0 of its 2 segments" in plan.reason, plan.reason
    answer = what_if(fleet, [], job, NOW)
    assert answer.plan is None and (answer.largest_free, answer.unit) == (0, "nodes")


def test_a_segment_larger_than_the_job_is_the_whole_job():
    fleet = Fleet.uniform(2)
    job = JobRequest("j", num_nodes=10, gpus_per_node=4, segment_nodes=25)

    assert place(fleet, job).placed
