"""The Fleet's capacity index (racks by idle-node count) against a brute-force scan:
the same candidates, and the same decisions, whatever the fleet went through."""

from __future__ import annotations

import dataclasses
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.defrag import _room_elsewhere
from placement.model import Fleet, JobRequest
from placement.place import place
from placement.policies import POLICIES
from placement.policies.common import Context
from placement.policies.rackwise import idle_room
from placement.validate import validate_indexes

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow],
)
SHAPES = [(18, 4, 2), (9, 4, 1), (1, 8, 0), (18, 4, 0)]
SIZES = [1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 72, 96, 128]


@st.composite
def histories(draw: st.DrawFn) -> tuple[Fleet, random.Random]:
    """A fleet after a random run of placements, releases and health changes."""
    groups = draw(st.lists(st.tuples(st.sampled_from(SHAPES), st.integers(1, 4)), min_size=1, max_size=3))
    fleet = Fleet.from_shapes([(n, npr, gpn, sp) for (npr, gpn, sp), n in groups])
    rng = random.Random(draw(st.integers(0, 10**6)))
    ids = sorted(fleet.nodes)
    for i in range(draw(st.integers(0, 60))):
        op = rng.random()
        if op < 0.65:
            job = JobRequest(
                f"j{i}",
                num_gpus=rng.choice(SIZES),
                locality=rng.choice(["required", "preferred", "none"]),
                preemptible=rng.random() < 0.7,
            )
            plan = place(fleet, job, rng.choice(sorted(POLICIES)), rng=rng)
            if plan.placed:
                fleet.allocate(plan.allocation(job))
        elif op < 0.85 and fleet.allocations:
            fleet.release(rng.choice(sorted(fleet.allocations)))
        else:
            fleet.set_health(rng.choice(ids), rng.choice(["healthy", "healthy", "failed", "draining"]))
    return fleet, rng


@SETTINGS
@given(histories(), st.integers(0, 20))
def test_the_index_gives_the_racks_a_scan_finds(history: tuple[Fleet, random.Random], at_least: int) -> None:
    fleet, _ = history
    assert validate_indexes(fleet) == []
    for gpn, racks in fleet.groups.items():
        scan = sorted((len(r.free), i, r.id) for i, r in enumerate(racks) if len(r.free) >= max(1, at_least))
        got = [(f, i, r.id) for f, i, r in fleet.racks_with_idle(gpn, at_least)]
        assert got == scan
    assert fleet.idle_total == sum(len(r.free) for r in fleet.racks)
    for gpn, racks in fleet.groups.items():
        for count in (1, at_least, len(racks) + 2):
            want = sorted(racks, key=lambda r: (-r.free_count, fleet.rack_pos[r.id]))[:count]
            assert [r.id for r in fleet.most_idle(gpn, count)] == [r.id for r in want]


@SETTINGS
@given(
    histories(),
    st.sampled_from(SIZES),
    st.sampled_from(["required", "preferred", "none"]),
    st.booleans(),
    st.integers(0, 3),
)
def test_decisions_from_the_index_match_a_scan(
    history: tuple[Fleet, random.Random], gpus: int, locality: str, preemptible: bool, n_reserved: int
) -> None:
    # A policy given a copy of the group's rack list scans it; given the group itself
    # it reads the index. Both must decide the same, reservations included.
    fleet, rng = history
    job = JobRequest("probe", num_gpus=gpus, locality=locality, preemptible=preemptible)
    reserved = frozenset(rng.sample(sorted(fleet.rack_by_id), min(n_reserved, len(fleet.racks))))
    for name, fn in sorted(POLICIES.items()):
        for racks in fleet.groups.values():
            if not job.is_small(racks[0].gpus_per_node) and not job.nodes_needed(racks[0].gpus_per_node):
                continue
            indexed = fn(fleet, job, racks, Context(random.Random(1), reserved, None))
            scanned = fn(fleet, job, list(racks), Context(random.Random(1), reserved, None))
            assert indexed.to_dict() == scanned.to_dict(), name


def _state(fleet: Fleet) -> tuple[object, ...]:
    """Everything the indexes hold, and the orders decisions could see."""
    return (
        fleet.to_dict(),
        list(fleet.allocations),
        [(n.id, n.used, list(n.jobs.items()), n.health) for n in fleet.nodes.values()],
        [(r.id, sorted(r.free), r.lent_nodes) for r in fleet.racks],
        {f: sorted(ids) for f, ids in fleet.partial.items() if ids},
        fleet.by_free,
        fleet.idle_total,
    )


@SETTINGS
@given(histories())
def test_a_copy_has_the_state_a_rebuild_gives(history: tuple[Fleet, random.Random]) -> None:
    # Fleet.copy copies the indexes; rebuilding allocates every job again, in order.
    fleet, _ = history
    copy = fleet.copy()
    assert _state(copy) == _state(Fleet.from_dict(fleet.to_dict())) == _state(fleet)
    assert validate_indexes(copy) == []


def _mutate(fleet: Fleet, rng: random.Random, steps: int, tag: str) -> None:
    ids = sorted(fleet.nodes)
    for i in range(steps):
        op = rng.random()
        if op < 0.5:
            job = JobRequest(f"{tag}{i}", num_gpus=rng.choice(SIZES), preemptible=rng.random() < 0.7)
            plan = place(fleet, job)
            if plan.placed:
                fleet.allocate(plan.allocation(job))
        elif op < 0.8 and fleet.allocations:
            alloc = fleet.release(rng.choice(sorted(fleet.allocations)))
            if rng.random() < 0.5:
                fleet.allocate(alloc, restore=True)  # back, now last in every order
        else:
            fleet.set_health(rng.choice(ids), rng.choice(["failed", "draining", "healthy"]))


@SETTINGS
@given(histories(), st.integers(0, 30), st.booleans())
def test_a_trial_leaves_the_fleet_as_it_was(
    history: tuple[Fleet, random.Random], steps: int, nested: bool
) -> None:
    # A trial inside a trial undoes its own changes only; the outer one, all of them.
    fleet, rng = history
    fleet.changed = set()
    before = _state(fleet)
    with fleet.trial():
        _mutate(fleet, rng, steps, "t")
        if nested:
            mid = _state(fleet)
            with fleet.trial():
                _mutate(fleet, rng, steps, "u")
                assert validate_indexes(fleet) == []
            assert _state(fleet) == mid
            _mutate(fleet, rng, steps, "v")
        assert validate_indexes(fleet) == []
    assert _state(fleet) == before
    assert validate_indexes(fleet) == []
    assert fleet.changed == set()  # the tracking saw none of it


@SETTINGS
@given(histories(), st.sampled_from([g for g in SIZES if g > 4]), st.booleans(), st.integers(1, 4))
def test_a_rack_local_gang_placed_outside_some_racks_gets_the_scans_plan(
    history: tuple[Fleet, random.Random], gpus: int, preemptible: bool, n_excluded: int
) -> None:
    # place(exclude=...) holds the excluded racks' idle nodes back and reads the
    # indexes; the plan must be the one rackwise finds scanning the racks left.
    fleet, rng = history
    job = JobRequest("probe", num_gpus=gpus, locality="required", preemptible=preemptible)
    skip = frozenset(rng.sample(sorted(fleet.rack_by_id), min(n_excluded, len(fleet.racks))))
    before = _state(fleet)
    got = place(fleet, job, exclude=skip)
    assert _state(fleet) == before
    best = None
    for racks in fleet.groups.values():
        left = [r for r in racks if r.id not in skip]
        if not left or not job.nodes_needed(racks[0].gpus_per_node):
            continue
        plan = POLICIES["rackwise"](fleet, job, left, Context(None, frozenset(), None))
        if plan.placed and (
            best is None or (len(plan.racks), len(plan.nodes)) < (len(best.racks), len(best.nodes))
        ):
            best = plan
    if best is None:
        assert not got.placed
    else:
        assert got.to_dict() == best.to_dict()


@SETTINGS
@given(histories(), st.booleans(), st.booleans())
def test_idle_room_says_no_only_when_rackwise_cannot_place(
    history: tuple[Fleet, random.Random], preemptible: bool, clock: bool
) -> None:
    # The simulator skips the decision when idle_room is False: it must never be
    # False for a job rackwise would place (with a clock a gang does not span).
    fleet, _ = history
    now = 60.0 if clock else None
    for gpus in SIZES:
        for locality in ("required", "preferred", "none"):
            for seg in (None, 2, 4, 8, 16):
                job = JobRequest(
                    "probe",
                    num_gpus=gpus,
                    locality=locality,
                    segment_nodes=seg,
                    preemptible=preemptible,
                    submit_time=0.0,
                    expected_duration=3600.0,
                )
                if not idle_room(fleet, job, Context(now=now)):
                    assert not place(fleet, job, "rackwise", now=now).placed, job


@SETTINGS
@given(histories(), st.integers(0, 3))
def test_room_elsewhere_says_no_only_when_a_moved_gang_cannot_land(
    history: tuple[Fleet, random.Random], extra: int
) -> None:
    # Defrag gives up a rack when _room_elsewhere says its occupant cannot move out:
    # it must never say so of a gang that rackwise would re-place as _clear asks
    # (outside the avoided racks, on at most as many racks as it spans now).
    fleet, rng = history
    racks = sorted(fleet.rack_by_id)
    for jid in sorted(fleet.allocations):
        alloc = fleet.allocations[jid]
        spread = len(fleet.racks_of(alloc))
        avoid = {fleet.racks_of(alloc)[0], *rng.sample(racks, min(extra, len(racks)))}
        if _room_elsewhere(fleet, alloc, avoid, spread):
            continue
        with fleet.trial():
            fleet.release(jid)
            job = alloc.job if spread > 1 else dataclasses.replace(alloc.job, locality="required")
            plan = place(fleet, job, exclude=avoid)
            assert not (plan.placed and not set(plan.racks) & avoid and len(plan.racks) <= spread), (
                alloc,
                avoid,
            )
