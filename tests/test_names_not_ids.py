"""Messages and the API name racks and hosts, not database ids (#28 item 2): the
what-if's and a placement's reasons name the rack, a placement lists its
segments by hostname beside the ids, and the engine's refusals name the host."""

from __future__ import annotations

import re

import pytest

from fleet import engine
from fleet.models import Job, Node, Rack
from fleet.services.decisions import scheduling
from fleet.services.jobs.submit import JobSpec, submit_job
from placement import model as pm

pytestmark = pytest.mark.django_db(transaction=True)


def _no_bare_ids(text: str, ids) -> None:
    for i in ids:
        assert not re.search(rf"(?:->|:|rack|node|on|in) \(?{i}\b", text), f"bare id {i} in: {text}"


def test_a_what_if_names_the_rack_it_would_use(fleet, submitter_client):
    response = submitter_client.post(
        "/api/jobs/what-if/",
        {"name": "w", "num_nodes": 8, "gpus_per_node": 4, "tenant": "llm"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert re.search(r"best fit: r[12] offers", body["reason"]), body["reason"]
    _no_bare_ids(body["reason"], Rack.objects.values_list("pk", flat=True))


def test_a_placement_names_its_racks_and_gives_hostnames_beside_node_ids(fleet, submitter, submitter_client):
    job = submit_job(
        submitter, JobSpec(name="seg", num_nodes=8, gpus_per_node=4, segment_nodes=4, tenant="llm")
    )
    scheduling.schedule_pass()
    job = Job.objects.get(pk=job.pk)
    placement = submitter_client.get(f"/api/jobs/{job.pk}/").json()["placement"]
    hosts = dict(Node.objects.values_list("pk", "hostname"))
    assert placement["segment_hosts"] == [[hosts[int(n)] for n in seg] for seg in placement["segments"]]
    for text in [placement["reason"], *placement["choices"]]:
        _no_bare_ids(text, Rack.objects.values_list("pk", flat=True))
    assert re.search(r"best fit: r[12] offers", placement["reason"]), placement["reason"]


def test_the_engine_names_the_host_when_a_gpu_is_taken(fleet):
    with engine.live_snapshot() as snap, snap.fleet.trial():
        node = next(iter(snap.fleet.nodes.values()))
        snap.fleet.allocate(pm.Allocation(pm.JobRequest("a", num_gpus=1), {node.id: (0,)}))
        with pytest.raises(pm.CapacityError) as caught:
            snap.fleet.allocate(pm.Allocation(pm.JobRequest("b", num_gpus=1), {node.id: (0,)}))
    assert Node.objects.get(pk=int(node.id)).hostname in str(caught.value)
