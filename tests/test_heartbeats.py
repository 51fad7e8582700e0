"""Node agents: tokens scoped to one node, heartbeats that carry GPU health, and
silence detection (healthy -> suspect -> failed)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from fleet import dispatch
from fleet.choices import GpuHealth, JobState, NodeState
from fleet.models import GPU, AgentToken, AuditEvent, Job, Node, Rack
from fleet.services.intake import health
from fleet.services.jobs.allocations import apply_placement
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.moves import mark_node_failed
from fleet.services.users import ensure_user

OK4 = {"gpus": [{"index": i, "state": "ok", "xids": [], "temperature_c": 45.0} for i in range(4)]}


def beat(*gpus: dict, agent_version: str = "test") -> dict:
    """A heartbeat with the given GPU entries and every other GPU ok."""
    given = {g["index"]: {"state": "ok", "xids": [], "temperature_c": 50.0} | g for g in gpus}
    return {
        "agent_version": agent_version,
        "gpus": [
            given.get(i, {"index": i, "state": "ok", "xids": [], "temperature_c": 50.0}) for i in range(4)
        ],
    }


def agent_client(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Agent {token}")
    return client


def post_beat(client: APIClient, node: Node, payload: dict):
    return client.post(f"/api/nodes/{node.pk}/heartbeat/", payload, format="json")


@pytest.fixture(autouse=True)
def heartbeat_limits(settings):
    settings.RACKWISE_HEARTBEAT_SUSPECT_S, settings.RACKWISE_HEARTBEAT_FAILED_S = 60, 180


@pytest.fixture
def node(fleet) -> Node:
    return Node.objects.get(hostname="r1-n00")


@pytest.fixture
def other_node(fleet) -> Node:
    return Node.objects.get(hostname="r1-n01")


@pytest.fixture
def token(node) -> str:
    return health.issue_agent_token(None, node.pk)


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, tuple]]:
    """Tasks the services enqueued (captured instead of going to the broker)."""
    calls: list[tuple[str, tuple]] = []
    monkeypatch.setattr(dispatch, "_send", lambda name, args, countdown=None: calls.append((name, args)))
    return calls


def gpu(node: Node, index: int) -> GPU:
    return GPU.objects.get(node=node, index=index)


def place_job_on(node: Node, owner) -> Job:
    job = submit_job(owner, JobSpec(name="train", tenant="llm", num_gpus=4))
    return apply_placement(owner, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")


# --- tokens ---------------------------------------------------------------------------


def test_the_token_names_its_node_and_only_a_hash_of_the_secret_is_stored(node, token):
    node_part, _, secret = token.partition(".")
    assert node_part == str(node.pk)
    stored = AgentToken.objects.get(node=node).key
    assert secret not in stored and len(stored) == 64
    assert AuditEvent.objects.filter(action="node.agent_token", object_id=str(node.pk)).exists()


def test_a_nodes_own_token_may_post_its_heartbeat(node, token):
    response = post_beat(agent_client(token), node, OK4)

    assert response.status_code == 200, response.data
    assert response.data["hostname"] == "r1-n00"
    assert response.data["node_state"] == NodeState.HEALTHY


def test_another_nodes_token_is_refused_with_403(node, other_node):
    other_token = health.issue_agent_token(None, other_node.pk)

    response = post_beat(agent_client(other_token), node, OK4)

    assert response.status_code == 403
    assert "r1-n01" in response.data["detail"]
    node.refresh_from_db()
    assert node.last_heartbeat_at is None


def test_an_operators_api_token_is_refused_with_403(node, token):
    _, user_token = ensure_user(None, "ops", role="operator")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {user_token}")

    response = post_beat(client, node, OK4)

    assert response.status_code == 403
    assert "agent" in response.data["detail"]


def test_an_operators_session_is_refused_with_403(node, operator_client):
    assert post_beat(operator_client, node, OK4).status_code == 403


def test_a_heartbeat_without_credentials_gets_401(node, token):
    response = post_beat(agent_client(None), node, OK4)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Agent"


def test_a_rotated_token_stops_working_and_the_new_one_works(node, token):
    new_token = health.issue_agent_token(None, node.pk)

    assert post_beat(agent_client(token), node, OK4).status_code == 401
    assert post_beat(agent_client(new_token), node, OK4).status_code == 200


@pytest.mark.parametrize("bad", ["garbage", "1", "x.secret", "{pk}.wrong-secret"])
def test_a_malformed_or_wrong_token_gets_401(node, token, bad):
    assert post_beat(agent_client(bad.format(pk=node.pk)), node, OK4).status_code == 401


def test_an_agent_token_opens_no_other_endpoint(node, token):
    assert agent_client(token).get(f"/api/nodes/{node.pk}/").status_code == 401


def test_operators_issue_tokens_through_the_api_and_the_token_works(node, operator_client):
    response = operator_client.post(f"/api/nodes/{node.pk}/agent-token/")

    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    assert post_beat(agent_client(response.data["token"]), node, OK4).status_code == 200


def test_viewers_cannot_issue_tokens(node, viewer_client):
    assert viewer_client.post(f"/api/nodes/{node.pk}/agent-token/").status_code == 403
    assert not AgentToken.objects.filter(node=node).exists()


def test_issuing_a_token_for_an_unknown_node_is_404(fleet, operator_client):
    assert operator_client.post("/api/nodes/999999/agent-token/").status_code == 404


def test_create_agent_token_prints_a_working_token(node):
    out = StringIO()
    call_command("create_agent_token", "r1-n00", stdout=out)

    assert post_beat(agent_client(out.getvalue().strip()), node, OK4).status_code == 200


def test_create_agent_token_refuses_an_unknown_host(fleet):
    with pytest.raises(CommandError, match="unknown host 'nope'"):
        call_command("create_agent_token", "nope", stdout=StringIO())


# --- heartbeats -----------------------------------------------------------------------


def test_a_heartbeat_stamps_the_node_and_changes_nothing_else_when_all_is_well(node, token):
    version = Rack.objects.get(pk=node.rack_id).version
    audits = AuditEvent.objects.count()

    post_beat(agent_client(token), node, OK4)

    node.refresh_from_db()
    assert node.last_heartbeat_at is not None
    assert timezone.now() - node.last_heartbeat_at < timedelta(seconds=10)
    assert AuditEvent.objects.count() == audits
    assert Rack.objects.get(pk=node.rack_id).version == version


def test_a_non_fatal_xid_marks_only_that_gpu_degraded(node, token):
    version = Rack.objects.get(pk=node.rack_id).version

    response = post_beat(agent_client(token), node, beat({"index": 2, "xids": [13]}))

    assert response.status_code == 200
    assert response.data["gpus_changed"] == [
        {
            "index": 2,
            "health_before": "ok",
            "health": "degraded",
            "last_error": "XID 13: graphics engine exception",
        }
    ]
    degraded = gpu(node, 2)
    assert (degraded.health, degraded.last_xid) == (GpuHealth.DEGRADED, 13)
    assert set(GPU.objects.filter(node=node).exclude(index=2).values_list("health", flat=True)) == {"ok"}
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    assert Rack.objects.get(pk=node.rack_id).version == version + 1
    event = AuditEvent.objects.get(action="gpu.health")
    assert event.actor_name == "agent:r1-n00"
    assert (event.before["health"], event.after["health"]) == ("ok", "degraded")


def test_a_degrading_gpu_proposes_draining_its_node_once_for_an_operator(node, token):
    from fleet.models import Action

    client = agent_client(token)
    post_beat(client, node, beat({"index": 2, "xids": [13]}))
    post_beat(client, node, beat({"index": 3, "xids": [13]}))

    (drain,) = Action.objects.filter(kind="drain")
    assert drain.state == "proposed", "drains wait for an operator by default"
    assert drain.steps == [
        {"op": "drain", "node": node.pk, "hostname": "r1-n00", "reason": drain.steps[0]["reason"]}
    ]
    assert "GPU 2" in drain.title and "XID 13" in drain.title
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY, "nothing is drained before the approval"


def test_health_changes_are_audited_once_not_on_every_heartbeat(node, token):
    client = agent_client(token)
    for _ in range(3):
        post_beat(client, node, beat({"index": 1, "state": "degraded"}))

    assert AuditEvent.objects.filter(action="gpu.health").count() == 1


def test_a_degraded_gpu_reported_ok_again_is_ok(node, token):
    client = agent_client(token)
    post_beat(client, node, beat({"index": 1, "xids": [31]}))

    post_beat(client, node, OK4)

    recovered = gpu(node, 1)
    assert (recovered.health, recovered.last_error, recovered.last_xid) == (GpuHealth.OK, "", 31)


def test_a_fatal_xid_fails_the_node_and_its_job_goes_to_recovering(
    node, token, submitter, sent, django_capture_on_commit_callbacks
):
    job = place_job_on(node, submitter)

    with django_capture_on_commit_callbacks(execute=True):
        response = post_beat(agent_client(token), node, beat({"index": 3, "xids": [79]}))

    assert response.status_code == 200
    assert (response.data["node_state_before"], response.data["node_state"]) == ("healthy", "failed")
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert "GPU 3: XID 79: GPU has fallen off the bus" in node.state_reason
    failed = gpu(node, 3)
    assert (failed.health, failed.last_xid) == (GpuHealth.FAILED, 79)
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    assert ("fleet.tasks.recover_job", (job.pk,)) in sent


def test_a_gpu_reported_failed_without_an_xid_fails_the_node(node, token):
    post_beat(agent_client(token), node, beat({"index": 0, "state": "failed", "error": "NVML: GPU is lost"}))

    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert "GPU 0: NVML: GPU is lost" in node.state_reason


def test_a_heartbeat_from_a_failed_node_records_but_does_not_revive_it(node, token):
    mark_node_failed(None, node.pk, "broken by hand")

    response = post_beat(agent_client(token), node, OK4)

    assert response.status_code == 200
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert node.state_reason == "broken by hand"
    assert node.last_heartbeat_at is not None


def test_a_failed_gpu_stays_failed_when_the_agent_later_says_ok(node, token):
    client = agent_client(token)
    post_beat(client, node, beat({"index": 0, "xids": [48]}))

    post_beat(client, node, OK4)

    assert gpu(node, 0).health == GpuHealth.FAILED


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"gpus": [{"index": 9, "state": "ok", "xids": []}]}, "gpus[0].index"),
        ({"gpus": [{"index": 0, "state": "melting", "xids": []}]}, "gpus[0].state"),
        ({"gpus": [{"index": 0, "state": "failed", "xids": ["79"]}]}, "gpus[0].xids"),
        ({"gpus": [{"index": 0, "state": "ok", "xids": [True]}]}, "gpus[0].xids"),
        ({"gpus": [{"index": 0, "state": "ok", "temperature_c": "hot"}]}, "gpus[0].temperature_c"),
        ({"gpus": [{"index": 0, "state": "ok"}, {"index": 0, "state": "ok"}]}, "gpus[1].index"),
        ({"gpus": "all fine"}, "gpus"),
        ({}, "gpus"),
        ([1, 2], "non_field_errors"),
    ],
)
def test_a_bad_payload_is_refused_with_400_and_nothing_is_written(node, token, payload, field):
    response = post_beat(agent_client(token), node, payload)

    assert response.status_code == 400
    assert field in response.data, response.data
    node.refresh_from_db()
    # The report is refused, but the node spoke: liveness is recorded apart from
    # it (test_heartbeat_validation.py), so nothing but last_heartbeat_at moves.
    assert node.last_heartbeat_at is not None
    assert node.state == NodeState.HEALTHY
    assert set(GPU.objects.filter(node=node).values_list("health", flat=True)) == {"ok"}


def test_a_bad_gpu_entry_refuses_the_whole_heartbeat_even_with_a_fatal_xid_beside_it(node, token):
    payload = {"gpus": [{"index": 0, "state": "ok", "xids": [79]}, {"index": 7, "state": "ok"}]}

    assert post_beat(agent_client(token), node, payload).status_code == 400
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY


def test_a_heartbeat_that_is_not_json_is_refused(node, token):
    response = agent_client(token).post(f"/api/nodes/{node.pk}/heartbeat/", {"gpus": "x"})

    assert response.status_code == 415


# --- silence --------------------------------------------------------------------------


@pytest.fixture
def t0():
    return timezone.now()


def heard_at(node: Node, when) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=when)


def test_a_silent_node_becomes_suspect_and_then_failed(node, t0):
    heard_at(node, t0)
    version = Rack.objects.get(pk=node.rack_id).version

    assert health.detect_failures(now=t0 + timedelta(seconds=59)) == {"suspect": 0, "failed": 0}
    assert health.detect_failures(now=t0 + timedelta(seconds=61)) == {"suspect": 1, "failed": 0}
    node.refresh_from_db()
    assert node.state == NodeState.SUSPECT
    assert Rack.objects.get(pk=node.rack_id).version == version + 1
    assert AuditEvent.objects.filter(action="node.suspect", object_id=str(node.pk)).count() == 1

    assert health.detect_failures(now=t0 + timedelta(seconds=179)) == {"suspect": 0, "failed": 0}
    assert health.detect_failures(now=t0 + timedelta(seconds=181)) == {"suspect": 0, "failed": 1}
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert "no heartbeat" in node.state_reason


def test_detecting_failures_twice_changes_nothing_the_second_time(node, t0):
    heard_at(node, t0)
    health.detect_failures(now=t0 + timedelta(seconds=100))
    audits = AuditEvent.objects.count()

    assert health.detect_failures(now=t0 + timedelta(seconds=100)) == {"suspect": 0, "failed": 0}
    assert AuditEvent.objects.count() == audits


def test_one_pass_never_takes_a_node_from_healthy_straight_to_failed(node, t0):
    heard_at(node, t0)  # e.g. the server was down for an hour: every node looks silent

    assert health.detect_failures(now=t0 + timedelta(hours=1)) == {"suspect": 1, "failed": 0}
    # Suspect for less than FAILED_S - SUSPECT_S: the agent still has time to reconnect.
    later = t0 + timedelta(hours=1, seconds=119)
    assert health.detect_failures(now=later) == {"suspect": 0, "failed": 0}
    assert health.detect_failures(now=later + timedelta(seconds=1)) == {"suspect": 0, "failed": 1}


def test_nodes_that_never_sent_a_heartbeat_are_not_monitored(fleet, t0):
    assert health.detect_failures(now=t0 + timedelta(days=1)) == {"suspect": 0, "failed": 0}
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.HEALTHY}


def test_a_silent_node_failed_by_detection_sends_its_job_to_recovering(node, t0, submitter, sent):
    job = place_job_on(node, submitter)
    heard_at(node, t0)

    health.detect_failures(now=t0 + timedelta(seconds=61))
    health.detect_failures(now=t0 + timedelta(seconds=181))

    job.refresh_from_db()
    assert job.state == JobState.RECOVERING


def test_a_resumed_heartbeat_returns_a_suspect_node_to_healthy(node, token, t0):
    heard_at(node, t0 - timedelta(seconds=120))
    health.detect_failures(now=t0)
    node.refresh_from_db()
    assert node.state == NodeState.SUSPECT

    response = post_beat(agent_client(token), node, OK4)

    assert (response.data["node_state_before"], response.data["node_state"]) == ("suspect", "healthy")
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.HEALTHY, "heartbeat resumed")
    # ...and the fresh heartbeat keeps it from being failed by the next pass.
    assert health.detect_failures(now=timezone.now()) == {"suspect": 0, "failed": 0}


def test_a_suspect_node_that_resumes_with_a_degraded_gpu_stays_suspect(node, token, t0):
    heard_at(node, t0 - timedelta(seconds=120))
    health.detect_failures(now=t0)

    post_beat(agent_client(token), node, beat({"index": 1, "state": "degraded"}))

    node.refresh_from_db()
    assert node.state == NodeState.SUSPECT
    assert gpu(node, 1).health == GpuHealth.DEGRADED


def test_a_heartbeat_after_the_suspect_scan_wins_over_a_stale_decision(node, t0):
    heard_at(node, t0)
    # The node is selected as silent, but speaks before the compare-and-set runs.
    heard_at(node, t0 + timedelta(seconds=100))

    assert not health._mark_suspect(node.pk, t0 + timedelta(seconds=40), t0 + timedelta(seconds=100))
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
