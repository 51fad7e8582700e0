"""Heartbeat bounds: every field a node agent sends is checked against what the
database can hold (a 400 naming the field, never a 500), and a refused report
still counts as a sign of life, so a talking node is never failed for silence."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.choices import GpuHealth, NodeState
from fleet.models import GPU, Node
from fleet.services.intake import health
from tests.test_heartbeats import agent_client, beat, post_beat


@pytest.fixture(autouse=True)
def heartbeat_limits(settings):
    settings.RACKWISE_HEARTBEAT_SUSPECT_S, settings.RACKWISE_HEARTBEAT_FAILED_S = 60, 180


@pytest.fixture
def node(fleet) -> Node:
    return Node.objects.get(hostname="r1-n00")


@pytest.fixture
def client(node):
    return agent_client(health.issue_agent_token(None, node.pk))


MALFORMED = [
    pytest.param({"index": 2, "xids": [2**31]}, "gpus[2].xids", id="xid beyond the 32-bit column"),
    pytest.param({"index": 2, "xids": [79] * 1000}, "gpus[2].xids", id="a thousand xids"),
    pytest.param(
        {"index": 2, "state": "failed", "error": "bad\x00byte"}, "gpus[2].error", id="NUL in the error"
    ),
    pytest.param(
        {"index": 2, "state": "degraded", "error": "x" * 501}, "gpus[2].error", id="over-long error"
    ),
    pytest.param({"index": 2, "temperature_c": 1e300}, "gpus[2].temperature_c", id="absurd temperature"),
]


@pytest.mark.parametrize(("gpu", "field"), MALFORMED)
def test_it_refuses_a_field_the_database_cannot_hold_with_a_400_naming_it(node, client, gpu, field):
    response = post_beat(client, node, beat(gpu))

    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not GPU.objects.filter(node=node).exclude(health=GpuHealth.OK).exists()


def test_it_refuses_a_nul_in_the_agent_version(node, client):
    response = post_beat(client, node, beat(agent_version="1.0\x00"))

    assert response.status_code == 400
    assert "agent_version" in response.json()


def test_it_refuses_more_gpu_entries_than_the_node_has_before_reading_them(node, client):
    payload = {"gpus": [{"index": 0, "state": "ok"}] * 10_000}

    response = post_beat(client, node, payload)

    assert response.status_code == 400
    assert response.json()["gpus"] == ["10000 entries, but this node has 4 GPUs (0, 1, 2, 3)"]
    # Only the first entries past the node's GPU count are looked at.
    assert max(int(key[5:].split("]")[0]) for key in response.json() if key.startswith("gpus[")) <= 4


def test_the_largest_xid_the_column_holds_is_accepted(node, client):
    response = post_beat(client, node, beat({"index": 1, "xids": [2**31 - 1]}))

    assert response.status_code == 200
    assert GPU.objects.get(node=node, index=1).last_xid == 2**31 - 1


def test_a_refused_report_still_records_that_the_node_is_alive(node, client):
    long_ago = timezone.now() - timedelta(seconds=170)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=long_ago)

    response = post_beat(client, node, beat({"index": 0, "xids": [2**31]}))

    assert response.status_code == 400
    node.refresh_from_db()
    assert node.last_heartbeat_at > long_ago + timedelta(seconds=160)


def test_a_node_whose_every_report_is_refused_is_never_failed_for_silence(node, client):
    """The issue's scenario: the agent repeats one malformed payload for three
    minutes. It is talking all along, so no pass of silence detection may make
    it suspect, let alone failed."""
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=30))
    for _ in range(40):  # one heartbeat every 5 s for 200 s
        assert post_beat(client, node, beat({"index": 0, "error": "nul\x00"})).status_code == 400
        # The periodic check, run 5 s after this heartbeat (just before the next).
        last = Node.objects.get(pk=node.pk).last_heartbeat_at
        assert health.detect_failures(now=last + timedelta(seconds=5)) == {"suspect": 0, "failed": 0}
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY


def test_a_suspect_node_whose_report_is_refused_is_back_from_silence(node, client):
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=120))
    health.detect_failures()
    assert Node.objects.get(pk=node.pk).state == NodeState.SUSPECT

    assert post_beat(client, node, beat({"index": 3, "xids": [2**40]})).status_code == 400

    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY
    assert "GPU report was refused" in node.state_reason


def test_a_suspect_node_with_a_degraded_gpu_stays_suspect_when_its_report_is_refused(node, client):
    GPU.objects.filter(node=node, index=1).update(health=GpuHealth.DEGRADED, last_error="XID 31")
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=120))
    health.detect_failures()

    assert post_beat(client, node, beat({"index": 3, "xids": [2**40]})).status_code == 400

    node.refresh_from_db()
    assert node.state == NodeState.SUSPECT
    assert node.last_heartbeat_at > timezone.now() - timedelta(seconds=60)
