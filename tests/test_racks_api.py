"""GET /api/racks/ (per-rack summaries, filters) and GET /api/racks/<id>/ (every
node and GPU cell, with the job on it, masked for other tenants)."""

from __future__ import annotations

from fleet.choices import NodeState
from fleet.models import GPU, Job, Node
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from fleet.services.nodes.inventory import create_rack


def place(owner, placement: dict[Node, list[int]], name: str = "job") -> Job:
    num_gpus = sum(len(idx) for idx in placement.values())
    spec = job_services.JobSpec(name=name, num_gpus=num_gpus)
    job = job_services.submit_job(owner, spec)
    return job_allocations.apply_placement(
        None, job.pk, {n.id: idx for n, idx in placement.items()}, reason="test"
    )


def by_name(response) -> dict[str, dict]:
    assert response.status_code == 200, response.content
    return {r["name"]: r for r in response.json()["results"]}


def nodes_by_state(**counts: int) -> dict[str, int]:
    return {state: counts.get(state, 0) for state in NodeState.values}


def test_the_rack_list_summarises_an_untouched_rack(fleet, viewer_client):
    racks = by_name(viewer_client.get("/api/racks/"))

    assert set(racks) == {"r1", "r2"}
    assert racks["r2"]["summary"] == {
        "gpus_total": 72,
        "gpus_used": 0,
        "gpus_free": 72,
        "gpus_failed": 0,
        "gpus_unavailable": 0,
        "nodes_total": 18,
        "nodes_free": 18,
        "nodes_by_state": nodes_by_state(healthy=18),
    }
    assert racks["r2"]["kind"] == "NVL72"
    assert (racks["r2"]["nodes_per_domain"], racks["r2"]["gpus_per_node"]) == (18, 4)


def test_the_rack_list_counts_allocations_and_drained_and_failed_nodes(
    fleet, submitter, operator, viewer_client
):
    r1, _ = fleet
    n = {node.slot: node for node in r1.nodes.all()}
    place(submitter, {n[0]: [0, 1, 2, 3], n[1]: [0, 1, 2, 3]}, name="gang")  # 2 whole nodes
    place(submitter, {n[2]: [0, 1]}, name="small")  # half a node
    node_services.drain_node(operator, n[3].pk)  # idle: drained
    node_services.mark_node_failed(operator, n[4].pk)  # idle: failed

    summary = by_name(viewer_client.get("/api/racks/"))["r1"]["summary"]

    assert summary == {
        "gpus_total": 72,
        "gpus_used": 10,
        # 16 healthy nodes x 4 GPUs, less the 10 allocated ones.
        "gpus_free": 54,
        "gpus_failed": 4,
        "gpus_unavailable": 4,  # the drained node
        "nodes_total": 18,
        # Healthy and without any allocation: slots 5..17.
        "nodes_free": 13,
        "nodes_by_state": nodes_by_state(healthy=16, drained=1, failed=1),
    }
    assert by_name(viewer_client.get("/api/racks/"))["r2"]["summary"]["gpus_free"] == 72


def test_a_failed_gpu_on_a_healthy_node_counts_as_failed_not_free(fleet, viewer_client):
    GPU.objects.filter(node__rack=fleet[0], node__slot=7, index=1).update(health="failed")

    summary = by_name(viewer_client.get("/api/racks/"))["r1"]["summary"]

    assert (summary["gpus_free"], summary["gpus_failed"], summary["gpus_used"]) == (71, 1, 0)
    assert summary["nodes_by_state"]["healthy"] == 18


def test_a_draining_node_is_neither_free_nor_failed(fleet, submitter, operator, viewer_client):
    node = fleet[0].nodes.get(slot=0)
    place(submitter, {node: [0, 1]})
    node_services.drain_node(operator, node.pk)

    summary = by_name(viewer_client.get("/api/racks/"))["r1"]["summary"]

    assert summary["nodes_by_state"]["draining"] == 1
    assert (summary["gpus_used"], summary["gpus_free"], summary["gpus_unavailable"]) == (2, 68, 2)
    assert summary["nodes_free"] == 17


def test_the_rack_list_shows_the_version_and_location(fleet, operator, viewer_client):
    node_services.drain_node(operator, fleet[0].nodes.get(slot=0).pk)

    racks = by_name(viewer_client.get("/api/racks/"))

    assert racks["r1"]["version"] == 1
    assert racks["r2"]["version"] == 0
    assert (racks["r1"]["site"], racks["r1"]["row"], racks["r1"]["position"]) == ("dc", "A", 1)


def test_the_rack_detail_has_every_node_and_gpu_cell_with_its_job(fleet, submitter, viewer_client):
    r1 = fleet[0]
    n = {node.slot: node for node in r1.nodes.all()}
    gang = place(submitter, {n[0]: [0, 1, 2, 3], n[1]: [0, 1, 2, 3]}, name="gang")
    small = place(submitter, {n[2]: [1, 3]}, name="small")

    response = viewer_client.get(f"/api/racks/{r1.pk}/")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["name"] == "r1"
    assert body["summary"]["gpus_used"] == 10
    assert [node["slot"] for node in body["nodes"]] == list(range(18))
    assert [node["hostname"] for node in body["nodes"]][:2] == ["r1-n00", "r1-n01"]
    for node in body["nodes"]:
        assert [gpu["index"] for gpu in node["gpus"]] == [0, 1, 2, 3]
        assert all(gpu["health"] == "ok" for gpu in node["gpus"])
    cells = {(node["slot"], gpu["index"]): gpu["job"] for node in body["nodes"] for gpu in node["gpus"]}
    assert len(cells) == 72
    gang_ref = {"id": gang.pk, "name": "gang", "tenant": "llm"}
    small_ref = {"id": small.pk, "name": "small", "tenant": "llm"}
    expected = {(0, i): gang_ref for i in range(4)} | {(1, i): gang_ref for i in range(4)}
    expected |= {(2, 1): small_ref, (2, 3): small_ref}
    assert {key: job for key, job in cells.items() if job is not None} == expected


def test_the_rack_detail_forgets_released_allocations(fleet, submitter, viewer_client):
    node = fleet[0].nodes.get(slot=0)
    job = place(submitter, {node: [0, 1, 2, 3]})
    job_services.cancel_job(None, job.pk)

    body = viewer_client.get(f"/api/racks/{fleet[0].pk}/").json()

    assert all(gpu["job"] is None for node in body["nodes"] for gpu in node["gpus"])
    assert body["summary"]["gpus_used"] == 0


def test_the_rack_detail_shows_gpu_health_and_errors(fleet, viewer_client):
    GPU.objects.filter(node__rack=fleet[0], node__slot=4, index=2).update(
        health="failed", last_error="XID 79: GPU fell off the bus", last_xid=79
    )

    body = viewer_client.get(f"/api/racks/{fleet[0].pk}/").json()

    cell = body["nodes"][4]["gpus"][2]
    assert (cell["health"], cell["last_error"], cell["last_xid"]) == (
        "failed",
        "XID 79: GPU fell off the bus",
        79,
    )
    assert body["summary"]["gpus_failed"] == 1


def test_a_submitter_sees_another_tenants_job_only_by_id(fleet, submitter, other_submitter, submitter_client):
    n = {node.slot: node for node in fleet[0].nodes.all()}
    theirs = place(other_submitter, {n[0]: [0, 1, 2, 3]}, name="secret-vision-run")
    mine = place(submitter, {n[1]: [0, 1]}, name="my-run")

    response = submitter_client.get(f"/api/racks/{fleet[0].pk}/")

    assert response.status_code == 200, response.content
    nodes = response.json()["nodes"]
    assert [gpu["job"] for gpu in nodes[0]["gpus"]] == [{"id": theirs.pk, "name": None, "tenant": None}] * 4
    assert [gpu["job"] for gpu in nodes[1]["gpus"]][:2] == [
        {"id": mine.pk, "name": "my-run", "tenant": "llm"}
    ] * 2
    assert "secret-vision-run" not in response.content.decode()
    assert "vision" not in response.content.decode()


def test_a_viewer_and_an_operator_see_every_tenants_job_in_full(
    fleet, other_submitter, viewer_client, operator_client
):
    node = fleet[0].nodes.get(slot=0)
    theirs = place(other_submitter, {node: [0]}, name="vision-run")

    for client in (viewer_client, operator_client):
        cell = client.get(f"/api/racks/{fleet[0].pk}/").json()["nodes"][0]["gpus"][0]
        assert cell["job"] == {"id": theirs.pk, "name": "vision-run", "tenant": "vision"}


def test_the_node_detail_masks_another_tenants_job_too(fleet, other_submitter, submitter_client):
    node = fleet[0].nodes.get(slot=0)
    theirs = place(other_submitter, {node: [0, 1]}, name="vision-run")

    response = submitter_client.get(f"/api/nodes/{node.pk}/")

    assert response.status_code == 200, response.content
    assert [gpu["job"] for gpu in response.json()["gpus"]] == [
        {"id": theirs.pk, "name": None, "tenant": None},
        {"id": theirs.pk, "name": None, "tenant": None},
        None,
        None,
    ]


def test_racks_can_be_filtered_by_site_and_row(fleet, viewer_client):
    create_rack(None, name="r3", site="dc2", row="B", position=1)
    create_rack(None, name="r4", site="dc2", row="A", position=2)

    assert set(by_name(viewer_client.get("/api/racks/?site=dc2"))) == {"r3", "r4"}
    assert set(by_name(viewer_client.get("/api/racks/?site=dc"))) == {"r1", "r2"}
    assert set(by_name(viewer_client.get("/api/racks/?row=A"))) == {"r1", "r2", "r4"}
    assert set(by_name(viewer_client.get("/api/racks/?site=dc2&row=B"))) == {"r3"}
    assert by_name(viewer_client.get("/api/racks/?site=nowhere")) == {}


def test_a_filtered_list_summarises_only_the_racks_it_returns(fleet, submitter, viewer_client):
    create_rack(None, name="r3", site="dc2", row="B")
    place(submitter, {fleet[0].nodes.get(slot=0): [0, 1, 2, 3]})

    racks = by_name(viewer_client.get("/api/racks/?site=dc"))

    assert racks["r1"]["summary"]["gpus_used"] == 4
    assert racks["r2"]["summary"]["gpus_used"] == 0
    assert "r3" not in racks


def test_an_unknown_rack_is_not_found(fleet, viewer_client):
    assert viewer_client.get("/api/racks/999999/").status_code == 404


def test_someone_without_a_role_cannot_list_racks(fleet, outsider_client):
    response = outsider_client.get("/api/racks/")

    assert response.status_code == 403
    assert "r1" not in response.content.decode()


def test_gpus_held_by_a_job_on_a_failed_node_are_counted_once(fleet, submitter, operator, viewer_client):
    n = {node.slot: node for node in fleet[0].nodes.all()}
    job = place(submitter, {n[0]: [0, 1, 2, 3], n[1]: [0, 1, 2, 3]}, name="gang")
    node_services.mark_node_failed(operator, n[0].pk, "XID 79")  # the job now recovers in place
    job.refresh_from_db()
    assert job.state == "recovering"

    summary = by_name(viewer_client.get("/api/racks/"))["r1"]["summary"]

    # Every GPU is in exactly one bucket: the 8 held GPUs are used (the job still
    # holds them), so the failed node's GPUs are not counted as failed a second time.
    assert (summary["gpus_used"], summary["gpus_failed"], summary["gpus_free"]) == (8, 0, 64)
    assert (
        summary["gpus_used"] + summary["gpus_free"] + summary["gpus_failed"] + summary["gpus_unavailable"]
        == summary["gpus_total"]
    )
    assert summary["nodes_by_state"]["failed"] == 1


def test_a_failed_gpu_still_held_by_a_job_counts_as_used(fleet, submitter, viewer_client):
    node = fleet[0].nodes.get(slot=0)
    place(submitter, {node: [0, 1, 2, 3]})
    GPU.objects.filter(node=node, index=2).update(health="failed", last_error="XID 79")
    GPU.objects.filter(node__rack=fleet[0], node__slot=1, index=0).update(health="failed")

    summary = by_name(viewer_client.get("/api/racks/"))["r1"]["summary"]

    assert (summary["gpus_used"], summary["gpus_failed"], summary["gpus_free"]) == (4, 1, 67)
    assert summary["gpus_unavailable"] == 0
