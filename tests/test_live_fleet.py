"""The scheduler's in-memory fleet (fleet.engine.LiveFleet): brought up to date
from the racks that changed, equal to a fresh load of the rows after every pass,
also while other processes fail nodes, finish jobs and release allocations."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from django.db import connection

from fleet import engine, locks
from fleet.choices import JobState
from fleet.models import Job, Node, Rack
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs.allocations import apply_placement, finish_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from fleet.services.nodes.inventory import create_rack
from tests.support import ROOT

# Another process changing the fleet through the services, as workers, the API
# and the cluster sync do: nodes fail, drain and come back, jobs start, finish,
# are cancelled and requeued (each releasing its allocations); and now and then
# it runs a scheduling pass itself, as a second scheduler that took the lease
# would, or one whose lease lapsed (plans, commits nothing), each with its own
# in-memory fleet, verified too. (Not a raw string: a backslash ending a line
# joins it to the next, which keeps the script's long line under the limit.)
CHURN = """
import os, random, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
django.setup()
from fleet.choices import HOLDING_JOB_STATES, JobState, NodeState
from fleet.models import Job, Node
from fleet.services.jobs import allocations, submit
from fleet.services.nodes import moves as nodes
from fleet.services.errors import Conflict, InvalidInput
from fleet.services.decisions.scheduling import schedule_pass
from fleet import locks


def lost_lease():
    raise locks.LockLost("lease lapsed")

rng = random.Random(int(sys.argv[1]))
deadline = time.monotonic() + float(sys.argv[2])
done = 0
while time.monotonic() < deadline:
    op = rng.choice(["fail", "return", "drain", "undrain", "start", "finish", "finish", "cancel", "requeue",
                     "schedule", "lost-lease"])
    try:
        if op == "schedule":
            try:
                with locks.decisions(wait=None) as lease:
                    schedule_pass(checkpoint=lease.checkpoint)
            except locks.Busy:
                pass
        elif op == "lost-lease":
            # A pass whose lease lapsed: it plans beside the holder's, and its
            # checkpoint refuses to commit.
            try:
                schedule_pass(checkpoint=lost_lease)
            except locks.LockLost:
                pass
        elif op in ("fail", "drain"):
            node = rng.choice(list(Node.objects.filter(state=NodeState.HEALTHY)))
            (nodes.mark_node_failed if op == "fail" else nodes.drain_node)(None, node.pk, reason="churn")
        elif op in ("return", "undrain"):
            states = [NodeState.FAILED] if op == "return" else [NodeState.DRAINING, NodeState.DRAINED]
            out = list(Node.objects.filter(state__in=states))
            if out:
                node = rng.choice(out)
                (nodes.return_node_to_service if op == "return" else nodes.undrain_node)(\
None, node.pk, reason="churn")
        else:
            states = [JobState.PLACED, JobState.RECOVERING] if op == "start" else list(HOLDING_JOB_STATES)
            held = list(Job.objects.filter(state__in=states).values_list("pk", flat=True))
            if held:
                job_id = rng.choice(held)
                if op == "start":
                    allocations.start_job(None, job_id)
                elif op == "finish":
                    allocations.finish_job(None, job_id, succeeded=True, reason="churn")
                elif op == "cancel":
                    submit.cancel_job(None, job_id)
                else:
                    allocations.requeue_job(None, job_id, reason="churn")
        done += 1
    except (Conflict, InvalidInput):
        pass
    time.sleep(rng.random() * 0.02)
print(done)
"""


def _churn(seed: int, seconds: float) -> subprocess.Popen:
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    return subprocess.Popen(
        [sys.executable, "-c", CHURN, str(seed), str(seconds)],
        cwd=ROOT,
        env=os.environ | {"DATABASE_URL": url, "RACKWISE_LIVE_FLEET_VERIFY": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _submit(user, i: int) -> None:
    shapes = [
        {"num_gpus": 1},
        {"num_gpus": 4},
        {"num_nodes": 2, "gpus_per_node": 4},
        {"num_nodes": 6, "gpus_per_node": 4},
        {"num_nodes": 20, "gpus_per_node": 4, "segment_nodes": 10},
    ]
    submit_job(
        user,
        JobSpec(
            name=f"churn-{i}",
            tenant="llm",
            expected_duration_s=600 + 60 * i,
            preemptible=bool(i % 2),
            **shapes[i % len(shapes)],
        ),
    )


@pytest.mark.django_db(transaction=True)
def test_the_in_memory_fleet_equals_a_fresh_load_after_every_pass_under_churn(submitter):
    for i in range(4):
        create_rack(None, name=f"c{i}", site="dc", row="A", position=i)
    for i in range(30):
        _submit(submitter, i)
    engine.forget_live_fleet()
    churn = _churn(seed=7, seconds=12)
    passes = placed = 0
    try:
        while churn.poll() is None:
            with locks.decisions(wait=30) as lease:  # as the task takes it
                placed += len(schedule_pass(checkpoint=lease.checkpoint).placed)
            passes += 1
            # After the pass, the fleet the next pass starts from must equal the
            # rows, read in one transaction (raises LiveFleetDrift).
            with engine.live_snapshot():
                pass
            _submit(submitter, 30 + passes)
    finally:
        churn.kill() if churn.poll() is None else None
        out, err = churn.communicate(timeout=30)
    assert churn.returncode == 0, err[-3000:]
    live = engine._live
    assert passes >= 20 and placed >= 20 and int(out) >= 100, (passes, placed, out)
    # It was brought up to date in place, not loaded again every pass.
    assert live.rebuilds == 1 and live.applied >= passes, (live.rebuilds, live.applied, passes)


def test_only_the_changed_racks_are_read_again(fleet, submitter, settings, django_assert_max_num_queries):
    settings.RACKWISE_LIVE_FLEET_VERIFY = False  # counted below: no fresh load beside it
    engine.forget_live_fleet()
    job = submit_job(submitter, JobSpec(name="a", tenant="llm", num_nodes=2, gpus_per_node=4))
    node_ids = list(Node.objects.filter(rack=fleet[0]).order_by("slot").values_list("pk", flat=True)[:2])
    apply_placement(None, job.pk, {n: [0, 1, 2, 3] for n in node_ids}, reason="test")
    with engine.live_snapshot() as snap:
        assert snap.fleet.allocations[str(job.pk)].nodes == {str(n): (0, 1, 2, 3) for n in node_ids}
    finish_job(None, job.pk, succeeded=True)
    node_services.mark_node_failed(None, Node.objects.get(rack=fleet[1], slot=5).pk, reason="test")
    with django_assert_max_num_queries(8), engine.live_snapshot() as snap:
        assert str(job.pk) not in snap.fleet.allocations
        assert snap.fleet.node_at(str(fleet[1].pk), 5).health == "failed"
        engine.verify(snap)
    assert engine._live.rebuilds == 1 and engine._live.applied == 1


def test_a_new_rack_or_a_changed_spare_count_loads_the_fleet_again(fleet):
    engine.forget_live_fleet()
    with engine.live_snapshot():
        pass
    create_rack(None, name="r3", site="dc", row="A", position=3)
    with engine.live_snapshot() as snap:
        assert len(snap.fleet.racks) == 3
    Rack.objects.filter(pk=fleet[0].pk).update(spare_nodes=4, version=fleet[0].version + 100)
    with engine.live_snapshot() as snap:
        assert snap.fleet.rack_by_id[str(fleet[0].pk)].spare_nodes == 4
    assert engine._live.rebuilds == 3


def test_a_change_that_skips_the_rack_version_is_caught_by_verify(fleet):
    """What verify is for: a write that does not go through bump_versions."""
    engine.forget_live_fleet()
    with engine.live_snapshot():
        pass
    Node.objects.filter(rack=fleet[0], slot=0).update(state="failed")
    with pytest.raises(engine.LiveFleetDrift, match="rack"), engine.live_snapshot():
        pass


def test_starting_a_job_moves_its_racks_versions(fleet, submitter):
    """A rack's event shows its jobs' states, and the scheduler plans with a
    running job's expected end: a start changes both (it bumped no version)."""
    job = submit_job(submitter, JobSpec(name="a", tenant="llm", num_gpus=4, expected_duration_s=3600))
    node = Node.objects.filter(rack=fleet[1]).first()
    apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")
    engine.forget_live_fleet()
    with engine.live_snapshot() as snap:
        assert snap.fleet.allocations[str(job.pk)].expected_end is not None  # from placed_at
    before = Rack.objects.get(pk=fleet[1].pk).version
    time.sleep(0.01)
    start_job(None, job.pk)
    assert Rack.objects.get(pk=fleet[1].pk).version == before + 1
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.RUNNING
    with engine.live_snapshot() as snap:  # verify: the expected end follows started_at
        assert snap.fleet.allocations[str(job.pk)].expected_end == job.started_at.timestamp() + 3600


def test_a_job_placed_between_reading_the_queue_and_the_snapshot_is_not_planned_again(
    fleet, submitter, monkeypatch
):
    """Another pass (one whose lease lapsed) can place a job after this pass read
    the queue: the snapshot then holds it. It raised CapacityError ("already
    holds an allocation") from the engine."""
    job = submit_job(submitter, JobSpec(name="raced", tenant="llm", num_gpus=4))
    other = submit_job(submitter, JobSpec(name="other", tenant="llm", num_gpus=4))
    node = Node.objects.filter(rack=fleet[0]).order_by("slot").first()
    snapshot = engine.live_snapshot

    @contextmanager
    def placed_meanwhile():
        apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="the other pass")
        with snapshot() as snap:
            yield snap

    monkeypatch.setattr(engine, "live_snapshot", placed_meanwhile)
    result = schedule_pass()
    assert result.placed == [other.pk]
    assert Job.objects.get(pk=job.pk).state == JobState.PLACED
