"""Health signals in heartbeats (issue #31): what the agent read from NVML is
checked, stored and shown at /api/nodes/<id>/signals/, with counter rates that
survive resets."""

from __future__ import annotations

import sys

import pytest

from fleet.agent import NvmlGpus, SimulatedGpus
from fleet.models import GPU, GpuReading, Node
from fleet.services.intake import health
from tests.fake_nvml import FakeNvml
from tests.signals_support import H200, UNSUPPORTED, signals_beat
from tests.test_agent_signals import heartbeat
from tests.test_heartbeats import agent_client, post_beat

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(fleet) -> Node:
    return Node.objects.get(hostname="r1-n00")


@pytest.fixture
def client(node):
    return agent_client(health.issue_agent_token(None, node.pk))


def test_a_heartbeat_carries_every_signal_and_the_api_shows_them(node, client, viewer_client):
    assert post_beat(client, node, signals_beat()).status_code == 200
    body = viewer_client.get(f"/api/nodes/{node.pk}/signals/").json()
    assert body["imex"] == {"status": "ready", "detail": "READY"}
    assert body["fabric"] == {"cluster_uuid": H200["fabric"]["cluster_uuid"], "clique_id": 7}
    gpu0 = body["gpus"][0]["reading"]
    assert gpu0["signals"] == H200 and gpu0["unsupported"] == UNSUPPORTED
    assert gpu0["temperature_c"] == 40.0
    assert set(gpu0["counters"]) == {
        "ecc.volatile_corrected",
        "ecc.volatile_uncorrected",
        "ecc.aggregate_corrected",
        "ecc.aggregate_uncorrected",
        "remapped_rows.correctable",
        "remapped_rows.uncorrectable",
        "pcie_replay_count",
        "nvlink.crc_flit",
        "nvlink.replay",
        "nvlink.recovery",
    }
    # A heartbeat from an agent that sends no signals leaves readings alone.
    other = Node.objects.get(hostname="r1-n01")
    beat = {"gpus": [{"index": i, "state": "ok", "xids": [], "temperature_c": 45.0} for i in range(4)]}
    assert post_beat(agent_client(health.issue_agent_token(None, other.pk)), other, beat).status_code == 200
    assert viewer_client.get(f"/api/nodes/{other.pk}/signals/").json()["gpus"][0]["reading"] is None


def test_counter_rates_survive_a_reset_and_quiet_heartbeats_write_nothing(node, client, viewer_client, clock):
    value = 0
    for minute in range(0, 91):
        clock.at = minute
        value = 0 if minute == 45 else value + 2  # the driver reloaded at minute 45
        assert post_beat(client, node, signals_beat(ecc__aggregate_corrected=value)).status_code == 200
    counter = viewer_client.get(f"/api/nodes/{node.pk}/signals/").json()["gpus"][0]["reading"]["counters"][
        "ecc.aggregate_corrected"
    ]
    assert counter["resets"] == 1 and counter["value"] == value
    assert counter["per_hour"]["1h"] == pytest.approx(120, rel=0.05), "2 a minute, the reset not a fall"
    assert counter["per_hour"]["10m"] == pytest.approx(120, rel=0.05)
    assert counter["per_hour"]["24h"] is None, "less than half a day seen"

    # Nothing rose and a minute has not gone by: the reading is not written again.
    read_at = GpuReading.objects.get(gpu__node=node, gpu__index=0).read_at
    clock.at = 90.5
    post_beat(client, node, signals_beat(ecc__aggregate_corrected=value))
    assert GpuReading.objects.get(gpu__node=node, gpu__index=0).read_at == read_at
    # A flag that changes is written at once.
    post_beat(client, node, signals_beat(ecc__aggregate_corrected=value, remapped_rows__pending=True))
    reading = GpuReading.objects.get(gpu__node=node, gpu__index=0)
    assert reading.read_at > read_at and reading.signals["remapped_rows"]["pending"] is True


def test_bad_signals_are_a_400_naming_each_field_and_nothing_is_stored(node, client):
    payload = signals_beat()
    sig = payload["gpus"][1]["signals"]
    sig["power_w"] = "hot"
    sig["ecc"]["volatile_corrected"] = -1
    sig["nvlink"] = {"source": "links", "links": [{"link": 99, "active": "yes"}]}
    sig["fabric"]["state"] = "weird"
    sig["clock_event_reasons"] = ["gpu_idle", "nap"]
    payload["gpus"][2]["unsupported"] = "all"
    payload["imex"] = {"status": "fine"}
    response = post_beat(client, node, payload)
    assert response.status_code == 400
    errors = response.json()
    assert set(errors) == {
        "gpus[1].signals.power_w",
        "gpus[1].signals.ecc.volatile_corrected",
        "gpus[1].signals.nvlink.links[0].link",
        "gpus[1].signals.nvlink.links[0].active",
        "gpus[1].signals.fabric.state",
        "gpus[1].signals.clock_event_reasons",
        "gpus[2].unsupported",
        "imex.status",
    }
    assert errors["gpus[1].signals.fabric.state"] == [
        "unknown value 'weird'; one of completed, in_progress, not_started, not_supported or null"
    ]
    assert not GpuReading.objects.exists()


@pytest.mark.parametrize("profile", ["h200", "blackwell", "older"])
def test_what_the_agent_sends_is_taken_as_it_is(node, client, viewer_client, monkeypatch, profile):
    """The agent's own heartbeat (NvmlGpus on tests/fake_nvml.py) through the API."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(profile, 4))
    payload = heartbeat(NvmlGpus())
    response = post_beat(client, node, payload)
    assert response.status_code == 200, response.content
    body = viewer_client.get(f"/api/nodes/{node.pk}/signals/").json()
    for sent, shown in zip(payload["gpus"], body["gpus"], strict=True):
        assert shown["reading"]["signals"] == sent["signals"]
        assert shown["reading"]["unsupported"] == sent["unsupported"]
    assert body["imex"] == payload["imex"]


@pytest.mark.parametrize(
    ("trouble", "rule"),
    [
        ("ecc", "corrected-ecc-rising"),
        ("remap", "remap-pending"),
        ("nvlink", "nvlink-crc-rising"),
        ("thermal", "hw-thermal-slowdown"),
    ],
)
def test_the_simulated_agents_trouble_is_judged_by_the_rules(
    node, client, clock, default_health_rules, trouble, rule
):
    """``--simulate --trouble 1:<kind>``: each of the demo's troubles trips a rule on
    GPU 1 (the rates once half an hour of heartbeats, a minute apart, is seen)."""
    source = SimulatedGpus(4, seed=1)
    source.trouble[1] = trouble
    for minute in range(35):
        clock.at = minute
        assert post_beat(client, node, heartbeat(source)).status_code == 200
    assert f"(rule {rule}" in GPU.objects.get(node=node, index=1).last_error
    assert GPU.objects.exclude(node=node, index=1).filter(last_error__contains="rule").count() == 0
