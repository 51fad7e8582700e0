"""Operator actions on nodes through the API: drain, undrain, mark-failed and
return-to-service; their conflicts, who may use them, and what they record."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, JobState, NodeState
from fleet.models import GPU, Allocation, AuditEvent, Job, Node, Rack
from fleet.services.decisions import recovery as recovery_services
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services


def url(node: Node, action: str) -> str:
    return f"/api/nodes/{node.pk}/{action}/"


def rack_version(node: Node) -> int:
    return Rack.objects.get(pk=node.rack_id).version


def node_events(node: Node):
    return AuditEvent.objects.filter(object_type="node", object_id=str(node.pk))


def placed_job(owner, nodes: list[Node], name: str = "job") -> Job:
    job = job_services.submit_job(owner, job_services.JobSpec(name=name, num_gpus=4 * len(nodes)))
    return job_allocations.apply_placement(None, job.pk, {n.id: [0, 1, 2, 3] for n in nodes}, reason="test")


@pytest.fixture
def node(fleet) -> Node:
    return fleet[0].nodes.get(slot=3)


# --- drain ----------------------------------------------------------------------


def test_draining_an_idle_node_drains_it_at_once(node, operator, operator_client):
    version = rack_version(node)

    response = operator_client.post(url(node, "drain"), {"reason": "firmware update"}, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "drained"
    assert body["state_reason"] == "firmware update"
    assert len(body["gpus"]) == 4
    node.refresh_from_db()
    assert node.state == "drained"
    assert node.state_reason == "firmware update"
    assert rack_version(node) == version + 1
    event = node_events(node).get()
    assert event.action == "node.drain"
    assert event.actor == operator
    assert event.message == "firmware update"
    assert event.before == {"state": "healthy", "state_reason": ""}
    assert event.after == {"state": "drained", "state_reason": "firmware update"}


@pytest.mark.parametrize("move", ["drain", "mark-failed"])
def test_a_disruptive_move_without_a_reason_is_refused_and_says_why(node, operator_client, move):
    response = operator_client.post(url(node, move), {"reason": "  "}, format="json")

    assert response.status_code == 400, response.content
    assert "takes the node out of service" in response.json()["reason"][0]
    node.refresh_from_db()
    assert node.state == "healthy"
    assert not node_events(node).exists()


@pytest.mark.parametrize("move", ["undrain", "return-to-service"])
def test_a_move_back_into_service_needs_no_reason(node, operator, operator_client, move):
    prepare = node_services.drain_node if move == "undrain" else node_services.mark_node_failed
    prepare(operator, node.pk, "setup")

    response = operator_client.post(url(node, move))

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "healthy"


def test_draining_a_busy_node_waits_for_its_job_then_drains(
    node, submitter, operator_client, django_capture_on_commit_callbacks
):
    job = placed_job(submitter, [node])

    response = operator_client.post(
        url(node, "drain"), {"reason": "swap PSU", "confirm": True}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "draining"
    assert [g["job"]["id"] for g in response.json()["gpus"]] == [job.pk] * 4
    node.refresh_from_db()
    assert node.state == "draining"
    job.refresh_from_db()
    assert job.state == "placed"
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 4

    job_allocations.start_job(None, job.pk)
    version = rack_version(node)
    with django_capture_on_commit_callbacks(execute=True):  # the node settles once the job's end commits
        job_allocations.finish_job(None, job.pk, succeeded=True)

    node.refresh_from_db()
    assert node.state == "drained"
    assert rack_version(node) > version


def test_a_draining_node_stays_draining_while_another_job_is_still_on_it(
    fleet, submitter, operator_client, django_capture_on_commit_callbacks
):
    node = fleet[0].nodes.get(slot=0)
    first = job_services.submit_job(submitter, job_services.JobSpec(name="a", num_gpus=2))
    second = job_services.submit_job(submitter, job_services.JobSpec(name="b", num_gpus=2))
    job_allocations.apply_placement(None, first.pk, {node.id: [0, 1]}, reason="test")
    job_allocations.apply_placement(None, second.pk, {node.id: [2, 3]}, reason="test")
    assert (
        operator_client.post(url(node, "drain"), {"reason": "PSU", "confirm": True}, format="json").json()[
            "state"
        ]
        == "draining"
    )

    job_allocations.finish_job(None, first.pk, succeeded=True)
    node.refresh_from_db()
    assert node.state == "draining"

    with django_capture_on_commit_callbacks(execute=True):
        job_services.cancel_job(None, second.pk)
    node.refresh_from_db()
    assert node.state == "drained"


# --- undrain --------------------------------------------------------------------


def test_undraining_a_drained_node_makes_it_healthy(node, operator, operator_client):
    node_services.drain_node(operator, node.pk, "maintenance")
    version = rack_version(node)

    response = operator_client.post(url(node, "undrain"), {"reason": "maintenance done"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "healthy"
    node.refresh_from_db()
    assert node.state == "healthy"
    assert node.state_reason == "maintenance done"
    assert rack_version(node) == version + 1
    event = node_events(node).get(action="node.undrain")
    assert event.before["state"] == "drained"
    assert event.after["state"] == "healthy"


def test_undraining_a_draining_node_keeps_its_job_running(node, submitter, operator, operator_client):
    job = placed_job(submitter, [node])
    node_services.drain_node(operator, node.pk)

    response = operator_client.post(url(node, "undrain"))

    assert response.status_code == 200, response.content
    node.refresh_from_db()
    assert node.state == "healthy"
    job.refresh_from_db()
    assert job.state == "placed"
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 4


# --- mark failed ----------------------------------------------------------------


def test_marking_a_node_failed_moves_its_jobs_to_recovering(fleet, submitter, operator, operator_client):
    r1 = fleet[0]
    broken, partner, elsewhere = (r1.nodes.get(slot=s) for s in (0, 1, 2))
    hit = placed_job(submitter, [broken, partner], name="hit")
    job_allocations.start_job(None, hit.pk)
    bystander = placed_job(submitter, [elsewhere], name="bystander")
    version = rack_version(broken)

    response = operator_client.post(
        url(broken, "mark-failed"), {"reason": "XID 79", "confirm": True}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "failed"
    broken.refresh_from_db()
    assert (broken.state, broken.state_reason) == ("failed", "XID 79")
    hit.refresh_from_db()
    assert hit.state == "recovering"
    assert hit.state_reason == f"node {broken.hostname} failed: XID 79"
    bystander.refresh_from_db()
    assert bystander.state == "placed"
    partner.refresh_from_db()
    assert partner.state == "healthy"
    assert rack_version(broken) > version
    interrupt = AuditEvent.objects.get(action="job.interrupt", object_id=str(hit.pk))
    assert interrupt.actor == operator
    assert interrupt.before["state"] == "running"
    assert interrupt.after["state"] == "recovering"
    assert node_events(broken).get(action="node.fail").message == "XID 79"


def test_two_nodes_failing_under_two_jobs_give_each_job_its_own_swap(fleet, submitter, operator):
    """The invariant checker judged a recovery plan on the whole fleet, where the
    other job still sat on its failed node: every plan was refused and the job
    requeued. It judges what the plan changes."""
    r1 = fleet[0]
    first = placed_job(submitter, [r1.nodes.get(slot=0), r1.nodes.get(slot=1)], name="first")
    second = placed_job(submitter, [r1.nodes.get(slot=2), r1.nodes.get(slot=3)], name="second")
    for job in (first, second):
        job_allocations.start_job(None, job.pk)
    for slot in (0, 2):
        node_services.mark_node_failed(operator, r1.nodes.get(slot=slot).pk, reason="XID 79")
    for job in (first, second):
        action = recovery_services.plan_recovery(job.pk)
        assert action is not None and action.kind == ActionKind.RECOVERY, job.name
        assert [s["op"] for s in action.steps] == ["swap", "restart"]
        assert Job.objects.get(pk=job.pk).state == JobState.RECOVERING


def test_a_failed_node_moves_the_versions_of_every_rack_its_jobs_hold(fleet, submitter, operator_client):
    """A job spread over two racks turns recovering when a node of the first fails:
    the second rack's event shows that job's state too, so its version must move
    (it stayed, and consoles showed the job running there until the next change)."""
    broken, other = fleet[0].nodes.get(slot=0), fleet[1].nodes.get(slot=0)
    job = placed_job(submitter, [broken, other], name="spread")
    job_allocations.start_job(None, job.pk)
    versions = {n.rack_id: rack_version(n) for n in (broken, other)}

    response = operator_client.post(
        url(broken, "mark-failed"), {"reason": "XID 79", "confirm": True}, format="json"
    )

    assert response.status_code == 200, response.content
    assert rack_version(broken) == versions[broken.rack_id] + 1
    assert rack_version(other) == versions[other.rack_id] + 1


def test_marking_a_drained_node_failed_is_allowed(node, operator, operator_client):
    node_services.drain_node(operator, node.pk)

    response = operator_client.post(url(node, "mark-failed"), {"reason": "XID 79"}, format="json")

    assert response.status_code == 200, response.content
    node.refresh_from_db()
    assert (node.state, node.state_reason) == ("failed", "XID 79")


# --- return to service ----------------------------------------------------------


def test_returning_a_failed_node_to_service_resets_its_gpu_health(node, operator, operator_client):
    GPU.objects.filter(node=node, index=2).update(health="failed", last_error="XID 79: GPU fell off the bus")
    GPU.objects.filter(node=node, index=3).update(health="degraded", last_error="XID 48: DBE")
    node_services.mark_node_failed(operator, node.pk, "XID 79")
    version = rack_version(node)

    response = operator_client.post(url(node, "return-to-service"), {"reason": "GPU replaced"}, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "healthy"
    assert [(g["health"], g["last_error"]) for g in body["gpus"]] == [("ok", "")] * 4
    node.refresh_from_db()
    assert (node.state, node.state_reason) == ("healthy", "GPU replaced")
    assert set(GPU.objects.filter(node=node).values_list("health", flat=True)) == {"ok"}
    assert set(GPU.objects.filter(node=node).values_list("last_error", flat=True)) == {""}
    assert rack_version(node) == version + 1
    assert node_events(node).get(action="node.return").before["state"] == "failed"


# --- suspect nodes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "state"), [("drain", "drained"), ("return-to-service", "healthy"), ("mark-failed", "failed")]
)
def test_a_suspect_node_can_be_drained_returned_or_failed(node, operator_client, action, state):
    Node.objects.filter(pk=node.pk).update(state="suspect", state_reason="ECC errors rising")

    response = operator_client.post(url(node, action), {"reason": "ECC"}, format="json")

    assert response.status_code == 200, response.content
    node.refresh_from_db()
    assert node.state == state
    assert node_events(node).get().before == {"state": "suspect", "state_reason": "ECC errors rising"}


# --- conflicts ------------------------------------------------------------------


def _drained(operator, node):
    node_services.drain_node(operator, node.pk)


def _failed(operator, node):
    node_services.mark_node_failed(operator, node.pk)


def _untouched(operator, node):
    pass


@pytest.mark.parametrize(
    ("prepare", "action", "state", "message"),
    [
        (_drained, "drain", "drained", "only a healthy or suspect node can be drained"),
        (_untouched, "undrain", "healthy", "only a draining or drained node can be undrained"),
        (_failed, "mark-failed", "failed", "it is already out of service"),
        (_untouched, "return-to-service", "healthy", "only a failed, in-repair or suspect node"),
        (_drained, "return-to-service", "drained", "use undrain for a drained node"),
        (_failed, "drain", "failed", "only a healthy or suspect node can be drained"),
    ],
)
def test_a_transition_that_does_not_apply_is_a_conflict(
    node, operator, operator_client, prepare, action, state, message
):
    prepare(operator, node)
    node.refresh_from_db()
    reason_before = node.state_reason
    version = rack_version(node)
    events = AuditEvent.objects.count()

    response = operator_client.post(url(node, action), {"reason": "again"}, format="json")

    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"node {node.hostname} is {state}" in detail
    assert message in detail
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (state, reason_before)
    assert rack_version(node) == version
    assert AuditEvent.objects.count() == events


def test_an_action_on_an_unknown_node_is_not_found(fleet, operator_client):
    response = operator_client.post("/api/nodes/999999/drain/")

    assert response.status_code == 404
    assert not AuditEvent.objects.filter(object_type="node").exists()


# --- permissions ----------------------------------------------------------------


@pytest.mark.parametrize("action", ["drain", "undrain", "mark-failed", "return-to-service"])
@pytest.mark.parametrize("client_fixture", ["submitter_client", "viewer_client", "outsider_client"])
def test_only_operators_may_act_on_nodes(request, node, action, client_fixture):
    client = request.getfixturevalue(client_fixture)
    version = rack_version(node)

    response = client.post(url(node, action), {"reason": "not mine to do"}, format="json")

    assert response.status_code == 403
    node.refresh_from_db()
    assert node.state == "healthy"
    assert rack_version(node) == version
    assert not node_events(node).exists()


def test_a_too_long_reason_is_refused_without_changing_the_node(node, operator_client):
    response = operator_client.post(url(node, "drain"), {"reason": "x" * 501}, format="json")

    assert response.status_code == 400
    assert "reason" in response.json()
    node.refresh_from_db()
    assert node.state == "healthy"
    assert not node_events(node).exists()


def test_each_action_bumps_the_rack_version(node, operator_client):
    versions = [rack_version(node)]
    for action in ("drain", "undrain", "mark-failed", "return-to-service"):
        response = operator_client.post(url(node, action), {"reason": action}, format="json")
        assert response.status_code == 200, (action, response.content)
        versions.append(rack_version(node))

    assert versions == sorted(set(versions))
    assert len(versions) == 5
    assert list(node_events(node).order_by("id").values_list("action", "message")) == [
        ("node.drain", "drain"),
        ("node.undrain", "undrain"),
        ("node.fail", "mark-failed"),
        ("node.return", "return-to-service"),
    ]


# --- guarded moves: what the state allows, and confirming what a move interrupts --------


def test_the_api_lists_the_moves_each_state_allows_and_every_other_pair_is_refused(
    node, operator, operator_client
):
    """Walk every (state, move) pair: the node's ``moves`` are exactly those the
    API carries out; every other move is a 409 that changes nothing."""
    for state in NodeState.values:
        allowed = node_services.moves_for(state)
        for move in node_services.MOVES:
            Node.objects.filter(pk=node.pk).update(state=state, state_reason="set up")
            assert operator_client.get(f"/api/nodes/{node.pk}/").json()["moves"] == allowed
            events = AuditEvent.objects.count()
            response = operator_client.post(url(node, move), {"reason": "walk"}, format="json")
            if move in allowed:
                assert response.status_code == 200, (state, move, response.content)
            else:
                assert response.status_code == 409, (state, move, response.content)
                assert Node.objects.get(pk=node.pk).state == state
                assert AuditEvent.objects.count() == events


def test_marking_a_busy_node_failed_needs_confirming_and_names_what_it_interrupts(
    fleet, submitter, operator_client
):
    nodes = list(fleet[0].nodes.order_by("slot")[:2])
    job = placed_job(submitter, nodes, name="llama-70b")
    job_allocations.start_job(None, job.pk)
    version = rack_version(nodes[0])

    response = operator_client.post(url(nodes[0], "mark-failed"), {"reason": "XID 79"}, format="json")

    assert response.status_code == 409, response.content
    body = response.json()
    assert body["confirm_required"] is True
    assert f"interrupts 1 job: #{job.pk} llama-70b (8 GPUs)" in body["detail"]
    assert "confirm: true" in body["detail"]
    (entry,) = body["impact"]["jobs"]
    assert (entry["id"], entry["gpus"], entry["gpus_here"]) == (job.pk, 8, 4)
    assert entry["gpu_hours_lost"] > 0 and body["impact"]["gpu_hours_lost"] == entry["gpu_hours_lost"]
    assert Node.objects.get(pk=nodes[0].pk).state == "healthy"
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert rack_version(nodes[0]) == version
    assert not node_events(nodes[0]).exists()

    confirmed = operator_client.post(
        url(nodes[0], "mark-failed"), {"reason": "XID 79", "confirm": True}, format="json"
    )
    assert confirmed.status_code == 200, confirmed.content
    assert Job.objects.get(pk=job.pk).state == JobState.RECOVERING


def test_draining_a_busy_node_needs_confirming_and_an_idle_one_does_not(fleet, submitter, operator_client):
    busy, idle = fleet[0].nodes.get(slot=0), fleet[0].nodes.get(slot=5)
    job = placed_job(submitter, [busy], name="sweep")

    refused = operator_client.post(url(busy, "drain"), {"reason": "PSU"}, format="json")
    assert refused.status_code == 409
    assert f"affects 1 job: #{job.pk} sweep" in refused.json()["detail"]
    assert refused.json()["impact"]["gpu_hours_lost"] == 0
    assert Node.objects.get(pk=busy.pk).state == "healthy"

    assert operator_client.post(url(idle, "drain"), {"reason": "PSU"}, format="json").status_code == 200


def test_a_long_failure_reason_on_a_busy_node_is_kept_whole_on_the_node_and_clipped_on_its_jobs(
    fleet, submitter, operator_client
):
    """#28 item 15: a ~480-character reason answered 500 when the node held jobs
    (the jobs' derived reason overflowed its 500-character column)."""
    node = fleet[0].nodes.get(slot=0)
    job = placed_job(submitter, [node], name="long")
    reason = ("XID 79: " + "GPU has fallen off the bus " * 18).strip()
    assert 470 < len(reason) <= 500

    response = operator_client.post(
        url(node, "mark-failed"), {"reason": reason, "confirm": True}, format="json"
    )

    assert response.status_code == 200, response.content
    assert Node.objects.get(pk=node.pk).state_reason == reason
    job_reason = Job.objects.get(pk=job.pk).state_reason
    assert (
        len(job_reason) == 500
        and job_reason.startswith(f"node {node.hostname} failed: XID 79")
        and job_reason.endswith("…")
    )
