"""``scripts/manage check_fleet``: the fleet's invariants and the waiting jobs it
has room for (fleet.services.read.invariants), as the soak test reads them."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from fleet.models import GPU, Allocation, Node
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.read import invariants

pytestmark = pytest.mark.django_db


def _run(submitter, rack, nodes: int, name: str = "a"):
    job = submit_job(submitter, JobSpec(name=name, num_nodes=nodes, gpus_per_node=4, tenant="llm"))
    chosen = Node.objects.filter(rack=rack).order_by("slot")[:nodes]
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in chosen}, reason="test setup")
    return start_job(None, job.pk)


def test_a_clean_fleet_passes(fleet, submitter):
    _run(submitter, fleet[0], 4)
    out = StringIO()

    call_command("check_fleet", stdout=out)

    assert out.getvalue().startswith("ok: no invariant broken")


def test_it_finds_a_gpu_that_was_held_twice_in_the_past(fleet, submitter):
    job = _run(submitter, fleet[0], 1)
    gpu = GPU.objects.get(pk=Allocation.objects.filter(job=job).values_list("gpu_id", flat=True).first())
    other = submit_job(submitter, JobSpec(name="b", num_gpus=1, tenant="llm"))
    # An allocation released an hour from now, made before the current one: the
    # two overlapped. The partial unique index only guards allocations still held.
    Allocation.objects.create(
        job=other,
        gpu=gpu,
        created_at=timezone.now() - timedelta(hours=1),
        released_at=timezone.now() + timedelta(hours=1),
    )

    assert invariants.gpus_ever_held_twice() == 1
    with pytest.raises(CommandError, match="held one GPU at once"):
        call_command("check_fleet")


def test_a_waiting_job_with_room_is_reported_as_placed_by_the_next_pass(fleet, submitter):
    job = submit_job(
        submitter, JobSpec(name="gang", num_nodes=12, gpus_per_node=4, segment_nodes=6, tenant="llm")
    )
    out = StringIO()

    call_command("check_fleet", "--json", stdout=out)

    [waiting] = json.loads(out.getvalue())["waiting"]
    assert waiting["job"] == job.pk and waiting["room_by_counts"] and waiting["placed_alone"]
    assert waiting["placed_by_pass"]


def test_room_by_counts_never_counts_spares(fleet, submitter):
    # r1 runs 4 nodes and r2 3: 14 and 15 idle, 12 and 13 beyond the two spares.
    _run(submitter, fleet[0], 4, "a")
    _run(submitter, fleet[1], 3, "b")
    from fleet import engine

    snap = engine.load_snapshot()
    fits = submit_job(submitter, JobSpec(name="13", num_nodes=13, gpus_per_node=4, tenant="llm"))
    too_big = submit_job(submitter, JobSpec(name="14", num_nodes=14, gpus_per_node=4, tenant="llm"))
    in_segments = submit_job(
        submitter, JobSpec(name="seg", num_nodes=24, gpus_per_node=4, segment_nodes=12, tenant="llm")
    )

    assert invariants.room_by_counts(snap.fleet, engine.job_request(fits))
    assert not invariants.room_by_counts(snap.fleet, engine.job_request(too_big))
    assert invariants.room_by_counts(snap.fleet, engine.job_request(in_segments))


def test_a_recovering_job_on_its_failed_node_is_not_a_violation(fleet, submitter):
    from fleet.choices import JobState
    from fleet.services.nodes.moves import mark_node_failed

    job = _run(submitter, fleet[0], 2)
    node = Node.objects.filter(gpus__allocations__job=job).first()
    mark_node_failed(None, node.pk, "XID 79")
    job.refresh_from_db()

    assert job.state == JobState.RECOVERING
    assert invariants.violations() == []
