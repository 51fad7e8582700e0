"""GET /api/fleet/summary/: totals, utilization, free nodes per rack and jobs by
state for the whole fleet."""

from __future__ import annotations

from fleet.choices import JobState, NodeState
from fleet.models import Job, Node
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services

URL = "/api/fleet/summary/"


def submit(owner, num_gpus: int, name: str = "job") -> Job:
    return job_services.submit_job(owner, job_services.JobSpec(name=name, num_gpus=num_gpus))


def place(job: Job, placement: dict[Node, list[int]]) -> Job:
    return job_allocations.apply_placement(
        None, job.pk, {n.id: idx for n, idx in placement.items()}, reason="test"
    )


def test_an_empty_fleet_has_zero_totals_and_zero_utilization(db, viewer_client):
    response = viewer_client.get(URL)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["racks"] == 0
    assert (body["gpus_total"], body["gpus_used"], body["gpus_free"], body["nodes_total"]) == (0, 0, 0, 0)
    assert body["utilization"] == 0.0
    assert body["utilization_of_usable"] == 0.0
    assert body["free_nodes_per_rack"] == []
    assert body["jobs_by_state"] == {state: 0 for state in JobState.values}


def test_an_idle_fleet_is_all_free(fleet, viewer_client):
    body = viewer_client.get(URL).json()

    assert body["racks"] == 2
    assert (body["gpus_total"], body["gpus_free"], body["gpus_used"], body["gpus_failed"]) == (144, 144, 0, 0)
    assert (body["nodes_total"], body["nodes_free"]) == (36, 36)
    assert body["nodes_by_state"] == {state: (36 if state == "healthy" else 0) for state in NodeState.values}
    assert body["utilization"] == 0.0
    assert body["free_nodes_per_rack"] == [
        {"rack_id": fleet[0].pk, "rack": "r1", "nodes_free": 18},
        {"rack_id": fleet[1].pk, "rack": "r2", "nodes_free": 18},
    ]


def test_the_summary_counts_allocations_failures_and_jobs(
    fleet, submitter, other_submitter, operator, viewer_client
):
    r1, r2 = fleet
    n1 = {node.slot: node for node in r1.nodes.all()}
    n2 = {node.slot: node for node in r2.nodes.all()}
    place(submit(submitter, 8, "gang"), {n1[0]: [0, 1, 2, 3], n1[1]: [0, 1, 2, 3]})
    running = place(submit(other_submitter, 2, "small"), {n2[0]: [0, 1]})
    job_allocations.start_job(None, running.pk)
    submit(submitter, 4, "waiting")
    job_services.cancel_job(None, submit(submitter, 4, "dropped").pk)
    node_services.mark_node_failed(operator, n2[17].pk)
    node_services.drain_node(operator, n1[17].pk)

    response = viewer_client.get(URL)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["racks"] == 2
    assert body["gpus_total"] == 144
    assert body["gpus_used"] == 10
    assert body["gpus_failed"] == 4
    assert body["gpus_unavailable"] == 4
    assert body["gpus_free"] == 144 - 10 - 4 - 4
    assert body["nodes_total"] == 36
    assert body["nodes_free"] == 36 - 3 - 2  # three busy nodes, one failed, one drained
    assert body["utilization"] == round(10 / 144, 4)
    assert body["utilization_of_usable"] == round(10 / 140, 4)
    assert body["nodes_by_state"]["healthy"] == 34
    assert body["nodes_by_state"]["failed"] == 1
    assert body["nodes_by_state"]["drained"] == 1
    assert body["free_nodes_per_rack"] == [
        {"rack_id": r1.pk, "rack": "r1", "nodes_free": 15},
        {"rack_id": r2.pk, "rack": "r2", "nodes_free": 16},
    ]
    assert body["jobs_by_state"] == {
        state: {"placed": 1, "running": 1, "pending": 1, "cancelled": 1}.get(state, 0)
        for state in JobState.values
    }


def test_a_finished_job_no_longer_counts_as_used(fleet, submitter, viewer_client):
    job = place(submit(submitter, 4), {fleet[0].nodes.get(slot=0): [0, 1, 2, 3]})
    assert viewer_client.get(URL).json()["gpus_used"] == 4
    job_allocations.start_job(None, job.pk)
    job_allocations.finish_job(None, job.pk, succeeded=True)

    body = viewer_client.get(URL).json()

    assert (body["gpus_used"], body["gpus_free"], body["nodes_free"]) == (0, 144, 36)
    assert body["utilization"] == 0.0
    assert body["jobs_by_state"]["completed"] == 1


def test_every_role_can_read_the_summary_but_an_outsider_cannot(
    fleet, submitter_client, operator_client, outsider_client
):
    assert submitter_client.get(URL).status_code == 200
    assert operator_client.get(URL).json()["gpus_total"] == 144
    response = outsider_client.get(URL)
    assert response.status_code == 403
    assert "gpus_total" not in response.json()


def test_a_full_fleet_losing_a_node_under_a_job_stays_at_full_not_over_full(
    fleet, submitter, operator, viewer_client
):
    nodes = list(Node.objects.order_by("rack__name", "slot"))
    job = job_services.submit_job(
        submitter, job_services.JobSpec(name="everything", num_gpus=144, segment_nodes=18)
    )
    place(job, {node: [0, 1, 2, 3] for node in nodes})
    node_services.mark_node_failed(operator, nodes[0].pk, "XID 79")  # the job recovers in place

    body = viewer_client.get(URL).json()

    assert (body["gpus_used"], body["gpus_failed"], body["gpus_free"], body["gpus_unavailable"]) == (
        144,
        0,
        0,
        0,
    )
    assert body["utilization"] == 1.0
    assert body["utilization_of_usable"] == 1.0
    assert body["jobs_by_state"]["recovering"] == 1
