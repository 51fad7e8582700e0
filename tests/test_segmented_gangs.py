"""A gang in segments (``segment_nodes`` below its size) is placed with each segment
inside one rack, over as many racks as its segments need, at every locality; the
what-if and the job page say so, and never contradict the fleet.

The live demo's case (issue 27): 8 NVL72 racks (18 nodes, 2 of them spares), each
with 7 or 8 idle nodes; a 12-node job in segments of 6 waited forever, told "the
largest free slice is 8", while a what-if for 6 nodes said it would start now."""

from __future__ import annotations

import pytest

from fleet.choices import JobState, RackKind
from fleet.models import Allocation, Job, Node
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.inventory import create_rack
from fleet.views import waiting_reason

URL = "/api/jobs/what-if/"


@pytest.fixture
def demo_racks(db, submitter):
    """8 racks of 18 nodes; racks 1, 3, 5, 7 run 10 nodes (8 idle), the others 11
    (7 idle), all non-preemptible, so every rack keeps its 2 spares."""
    racks = [
        create_rack(None, name=f"r{i}", kind=RackKind.NVL72, site="dc", row="A", position=i)
        for i in range(1, 9)
    ]
    for i, rack in enumerate(racks, 1):
        busy = 10 if i % 2 else 11
        run_on(submitter, rack, busy, name=f"busy{i}")
    return racks


def run_on(submitter, rack, nodes: int, name: str) -> Job:
    job = submit_job(
        submitter,
        JobSpec(
            name=name,
            num_nodes=nodes,
            gpus_per_node=4,
            tenant="llm",
            preemptible=False,
            expected_duration_s=3600,
        ),
    )
    picked = Node.objects.filter(rack=rack).order_by("slot")[:nodes]
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in picked}, reason="test setup")
    return start_job(None, job.pk)


def spec(locality: str, **kw) -> dict:
    return {
        "name": "seg",
        "num_nodes": 12,
        "gpus_per_node": 4,
        "segment_nodes": 6,
        "locality": locality,
        "preemptible": False,
        "expected_duration_s": 3600,
        "tenant": "llm",
        **kw,
    }


def racks_of_segments(job: Job) -> list[set[int]]:
    rows = Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
        "gpu__node_id", "gpu__node__rack_id"
    )
    by_node = dict(rows)
    return [{by_node[int(n)] for n in segment} for segment in job.placement["segments"]]


@pytest.mark.parametrize("locality", ["required", "preferred", "none"])
def test_the_demo_job_is_placed_in_two_racks_one_segment_each(demo_racks, submitter, locality):
    job = submit_job(submitter, JobSpec(**spec(locality)))

    result = schedule_pass()

    job.refresh_from_db()
    assert job.pk in result.placed, result.waiting.get(job.pk)
    assert job.state == JobState.PLACED
    racks = racks_of_segments(job)
    assert [len(r) for r in racks] == [1, 1] and len(set.union(*racks)) == 2  # each segment in one rack
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 12 * 4


@pytest.mark.parametrize("locality", ["required", "preferred", "none"])
def test_the_what_if_says_it_starts_now(demo_racks, submitter_client, locality):
    body = submitter_client.post(URL, spec(locality), format="json").json()

    assert body["starts_now"] is True, body
    assert len(body["placement"]) == 12 and len(body["racks"]) == 2
    assert body["summary"].startswith("would start now on r")


def test_a_segmented_job_that_waits_is_told_the_room_in_whole_segments(
    demo_racks, submitter, submitter_client
):
    # Every rack down to 7 idle nodes: 5 offered beside the 2 spares, no room for a
    # segment of 6 anywhere, though each rack has more than 6 idle nodes.
    for i, rack in enumerate(demo_racks, 1):
        if i % 2:
            _one_more(submitter, rack, i)
    body = submitter_client.post(URL, spec("required"), format="json").json()
    assert body["starts_now"] is False
    assert body["largest_free_slice"] == 0 and body["largest_free_unit"] == "nodes"
    assert "the free racks hold 0 of its 12 nodes in whole segments of 6" in body["summary"], body["summary"]
    assert "room for 0 of its 2 segments" in body["reason"], body["reason"]

    job = submit_job(submitter, JobSpec(**spec("required")))
    schedule_pass()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    words = waiting_reason(job)
    assert words.startswith(
        "needs 12 nodes in segments of 6, each inside one rack; "
        "the free racks hold 0 of its 12 nodes in whole segments of 6"
    ), words
    assert "largest free slice is 7" not in words


def _one_more(submitter, rack, i: int) -> None:
    """Take the rack's 11th node too (a 1-node non-preemptible job)."""
    job = submit_job(
        submitter,
        JobSpec(
            name=f"more{i}",
            num_nodes=1,
            gpus_per_node=4,
            tenant="llm",
            preemptible=False,
            expected_duration_s=3600,
        ),
    )
    node = Node.objects.filter(rack=rack).order_by("slot")[10]
    apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test setup")
    start_job(None, job.pk)
