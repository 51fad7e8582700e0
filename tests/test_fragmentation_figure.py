"""One fragmentation figure (issue 27): one definition (placement.fragmentation,
docs/fragmentation.md), the same number in the console header (fed by
/api/fleet/fragmentation/), the Fleet chart's latest sample and /metrics, and a
largest free slice that is the best rack card's slice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet import engine, read_cache
from fleet.models import FleetSample, Node
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.read import read_models
from fleet.services.read.metrics import record_sample, samples_since


def _run(submitter, rack, name: str, gpus_by_slot: dict[int, list[int]], **spec) -> None:
    """A running job on these slots of ``rack``."""
    job = submit_job(submitter, JobSpec(name=name, tenant="llm", expected_duration_s=10**6, **spec))
    nodes = {n.slot: n.pk for n in Node.objects.filter(rack=rack)}
    apply_placement(None, job.pk, {nodes[s]: g for s, g in gpus_by_slot.items()}, reason="test setup")
    start_job(None, job.pk)


@pytest.fixture
def broken_up(fleet, submitter):
    """r1: a non-preemptible 4-node job, so 14 idle nodes of which 2 are kept spare:
    a 12-node slice. r2: one 1-GPU job on n00 (3 GPUs stuck there; it borrows one
    spare), so 17 idle nodes of which 1 is kept spare: a 16-node slice. A
    non-preemptible 16-node gang waits.

    The typical multi-node job, by GPU demand: the waiting 64 GPUs against r1's 16
    (the 1-GPU job takes no more than a node): 16 nodes. r1's 12-node slice cannot
    hold it, r2's can. Counted: r1 12 x 4 = 48, r2 3 + 16 x 4 = 67, 115 GPUs;
    fragmented: r1's 48 and r2's 3 stuck GPUs, 51; 51 / 115 = 44%."""
    r1, r2 = fleet
    _run(
        submitter,
        r1,
        "b",
        {s: [0, 1, 2, 3] for s in range(4)},
        num_nodes=4,
        gpus_per_node=4,
        preemptible=False,
    )
    _run(submitter, r2, "tiny", {0: [0]}, num_gpus=1)
    submit_job(submitter, JobSpec(name="big", num_nodes=16, gpus_per_node=4, tenant="llm", preemptible=False))
    return fleet


def _metrics() -> dict[str, float]:
    response = Client().get("/metrics")
    assert response.status_code == 200, response.content
    return {
        s.name: s.value
        for f in text_string_to_metric_families(response.content.decode())
        for s in f.samples
        if not s.labels
    }


@pytest.fixture(params=[False, True], ids=["computed", "read-models"])
def read_model_mode(request, settings):
    """Each figure computed where it is read, or all of them through the shared
    read models (as the app servers run)."""
    settings.RACKWISE_READ_MODELS = request.param
    settings.RACKWISE_READ_MODEL_MAX_AGE_S = 0
    keys = [read_cache.KEY, read_models.PREFIX + "summary", read_models.PREFIX + "fragmentation"]
    cache.delete_many(keys)
    yield request.param
    cache.delete_many(keys)


def test_an_idle_fleet_is_not_fragmented_anywhere(fleet, viewer_client):
    body = viewer_client.get("/api/fleet/fragmentation/").json()
    assert body["fraction"] == 0 and body["fragmented_gpus"] == 0
    # The 2 spares of each rack are neither usable nor fragmented: not counted.
    assert (body["free_gpus"], body["spare_gpus"], body["counted_gpus"]) == (144, 16, 128)
    assert _metrics()["rackwise_fragmentation"] == 0
    assert record_sample().fragmentation == 0


def test_a_full_fleet_is_not_fragmented(fleet, submitter, viewer_client):
    for rack in fleet:
        _run(
            submitter,
            rack,
            f"all-{rack.name}",
            {s: [0, 1, 2, 3] for s in range(18)},
            num_nodes=18,
            gpus_per_node=4,
        )
    body = viewer_client.get("/api/fleet/fragmentation/").json()
    assert (body["free_gpus"], body["counted_gpus"], body["fraction"]) == (0, 0, 0)
    assert body["largest_slice_nodes"] == 0


def test_a_broken_up_fleet_gives_the_number_the_definition_says(broken_up, viewer_client):
    body = viewer_client.get("/api/fleet/fragmentation/").json()
    assert (body["typical_job_gpus"], body["typical_from"]) == (64, "jobs")
    racks = {r["rack"]: r for r in body["racks"]}
    assert {
        k: racks["r1"][k]
        for k in ("idle_nodes", "spare_nodes", "slice_nodes", "share_nodes", "fragmented_gpus")
    } == {"idle_nodes": 14, "spare_nodes": 2, "slice_nodes": 12, "share_nodes": 16, "fragmented_gpus": 48}
    assert {k: racks["r2"][k] for k in ("idle_nodes", "spare_nodes", "slice_nodes", "fragmented_gpus")} == {
        "idle_nodes": 17,
        "spare_nodes": 1,
        "slice_nodes": 16,
        "fragmented_gpus": 3,
    }
    assert (body["counted_gpus"], body["fragmented_gpus"]) == (115, 51)
    assert body["fraction"] == pytest.approx(51 / 115, abs=1e-6)


def test_header_chart_api_and_metrics_show_one_number(broken_up, viewer_client, read_model_mode):
    # The header: fleet.js writes these fields of /api/fleet/fragmentation/.
    api = viewer_client.get("/api/fleet/fragmentation/").json()
    header = f"{api['fraction'] * 100:.0f}%"
    # The chart: a sample written now is its latest point.
    record_sample()
    chart = viewer_client.get("/api/console/samples/", {"hours": 1}).json()["samples"][-1]
    metrics = _metrics()

    assert header == "44%"
    assert chart["fragmentation"] == pytest.approx(api["fraction"], abs=1e-4)
    assert metrics["rackwise_fragmentation"] == pytest.approx(
        api["fraction"], abs=1e-6
    )  # the API rounds to 6 places
    assert metrics["rackwise_fragmented_gpus"] == api["fragmented_gpus"]
    assert metrics["rackwise_largest_placeable_job_gpus"] == api["largest_job_gpus"]
    assert FleetSample.objects.latest("at").largest_job_gpus == api["largest_job_gpus"]


def test_the_chart_keeps_its_latest_sample_when_it_thins_them(db):
    now = timezone.now()
    FleetSample.objects.bulk_create(
        FleetSample(
            at=now - timedelta(minutes=m),
            utilization=0,
            fragmentation=m / 100,
            jobs_pending=0,
            wait_p50_s=0,
            wait_p95_s=0,
        )
        for m in range(100, -1, -1)
    )
    rows = samples_since(hours=3, limit=10)
    assert len(rows) == 10
    assert rows[0].fragmentation == 1.0 and rows[-1].fragmentation == 0.0, "the oldest and the latest"


def test_the_largest_rack_local_job_is_the_best_rack_cards_slice(broken_up, viewer_client):
    body = viewer_client.get("/api/fleet/fragmentation/").json()
    # Each rack card shows racks[].slice_nodes (fleet.js, by rack_id), spares kept
    # as the engine keeps them for a non-preemptible gang.
    slices = {r["rack_id"]: r["slice_nodes"] for r in body["racks"]}
    assert slices == {broken_up[0].pk: 12, broken_up[1].pk: 16}
    with engine.live_snapshot() as snap:
        assert slices == {int(r.id): r.slice_offer() for r in snap.fleet.racks}
    assert body["largest_slice_nodes"] == max(slices.values()) == 16
    assert body["largest_job_gpus"] == 16 * 4


def test_the_fleet_page_says_what_the_figure_means(fleet, viewer):
    client = Client()
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert 'data-testid="fragmentation-definition"' in page
    assert "spare nodes racks keep idle for recovery" in page
    assert 'data-total="fragmentation"' in page and 'data-total="largest"' in page
