"""Health rules (issue #31): each default rule's verdict from a heartbeat through
the API, with the reading that caused it; operators change the rules, audited;
a node a rule drains takes no new work and is drained when its job ends."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, GpuHealth, NodeState
from fleet.models import GPU, Action, AuditEvent, HealthRule, Node
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.intake import health
from fleet.services.jobs.allocations import apply_placement, finish_job, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.signals_support import signals_beat
from tests.test_heartbeats import agent_client, post_beat

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def rules(default_health_rules):
    pass


@pytest.fixture
def node(fleet) -> Node:
    return Node.objects.get(hostname="r1-n00")


@pytest.fixture
def client(node):
    return agent_client(health.issue_agent_token(None, node.pk))


def _on_gpu0(beat: dict, **changes) -> dict:
    """``beat`` with ``changes`` (signals_beat's paths) on GPU 0 only."""
    gpu0 = signals_beat(**changes)["gpus"][0]
    beat["gpus"][0] = gpu0
    return beat


# (rule, the signals that trip it on GPU 0 at once, or a counter that rises per minute)
AT_ONCE = [
    ("remap-failure", {"remapped_rows__failure": True}),
    ("uncorrectable-ecc", {"ecc__volatile_uncorrected": 1}),
    ("remap-pending", {"remapped_rows__pending": True}),
    ("retired-pages-pending", {"retired_pages": {"single_bit": 0, "double_bit": 1, "pending": True}}),
    ("hw-slowdown", {"clock_event_reasons": ["hw_slowdown"]}),
    ("hw-thermal-slowdown", {"clock_event_reasons": ["hw_thermal_slowdown"]}),
    ("hw-power-brake", {"clock_event_reasons": ["hw_power_brake_slowdown"]}),
    ("fabric-health", {"fabric__health_mask": 4}),
]
RISING = [
    ("corrected-ecc-rising", "ecc__volatile_corrected", 5),  # 300/h
    ("pcie-replays-rising", "pcie_replay_count", 5),
    ("nvlink-crc-rising", "nvlink__crc_flit", 50),  # 3,000/h
    ("nvlink-recovery-rising", "nvlink__recovery", 1),  # 60/h
    ("corrected-ecc-climbing", "ecc__volatile_corrected", 1),  # 60/h: suspect, not drain
    ("pcie-replays-climbing", "pcie_replay_count", 1),
    ("nvlink-crc-climbing", "nvlink__crc_flit", 5),  # 300/h
]


def _check(node: Node, rule: HealthRule) -> None:
    gpu = GPU.objects.get(node=node, index=0)
    node.refresh_from_db()
    assert f"(rule {rule.name}" in gpu.last_error, gpu.last_error
    assert GPU.objects.filter(node=node).exclude(index=0).filter(health=GpuHealth.OK).count() == 3
    if rule.verdict == "fail":
        assert gpu.health == GpuHealth.FAILED and node.state == NodeState.FAILED
        assert f"(rule {rule.name}" in node.state_reason
    elif rule.verdict == "drain":
        assert gpu.health == GpuHealth.DEGRADED
        assert node.state == NodeState.DRAINED, "idle: drained at once"
        assert f"(rule {rule.name}" in node.state_reason and node.state_reason.endswith("(health rule)")
    else:
        assert gpu.health == GpuHealth.DEGRADED and node.state == NodeState.HEALTHY
        assert not Action.objects.filter(kind=ActionKind.DRAIN).exists(), "suspect proposes nothing"


@pytest.mark.parametrize(("name", "changes"), AT_ONCE, ids=[r[0] for r in AT_ONCE])
def test_a_rule_on_a_flag_or_value_gives_its_verdict_from_one_heartbeat(node, client, name, changes):
    assert post_beat(client, node, signals_beat()).status_code == 200
    assert GPU.objects.get(node=node, index=0).health == GpuHealth.OK
    assert post_beat(client, node, _on_gpu0(signals_beat(), **changes)).status_code == 200
    _check(node, HealthRule.objects.get(name=name))


@pytest.mark.parametrize(("name", "path", "per_minute"), RISING, ids=[r[0] for r in RISING])
def test_a_rate_rule_fires_once_the_counter_rises_fast_over_its_window(
    node, client, clock, name, path, per_minute
):
    for minute in range(31):  # half of the hour's window
        clock.at = minute
        slow = minute // 10  # 6 an hour: below every default rate
        assert post_beat(client, node, _on_gpu0(signals_beat(), **{path: slow})).status_code == 200
    assert GPU.objects.get(node=node, index=0).health == GpuHealth.OK, "a slow rise trips nothing"
    for minute in range(31, 62):
        clock.at = minute
        value = 3 + (minute - 30) * per_minute * 2
        post_beat(client, node, _on_gpu0(signals_beat(), **{path: value}))
    _check(node, HealthRule.objects.get(name=name))


def test_a_burst_fires_before_half_the_window_is_seen_once_it_alone_exceeds_the_rate(node, client, clock):
    """An agent that just started has minutes of history, not the half hour a
    rate over an hour needs: a rise that alone exceeds the hourly threshold
    fires anyway (over 1,000 NVLink CRC errors in 10 minutes: above 1,000/h
    whatever the rest of the hour brings); a smaller one waits for the window."""
    for minute in range(6):
        clock.at = minute
        post_beat(client, node, _on_gpu0(signals_beat(), nvlink__crc_flit=30 * minute))
    assert GPU.objects.get(node=node, index=0).health == GpuHealth.OK, "150 in 5 min: not yet"
    for minute in range(6, 11):
        clock.at = minute
        post_beat(client, node, _on_gpu0(signals_beat(), nvlink__crc_flit=150 + 200 * (minute - 5)))
    gpu = GPU.objects.get(node=node, index=0)
    node.refresh_from_db()
    assert gpu.health == GpuHealth.DEGRADED and node.state == NodeState.DRAINED
    assert gpu.last_error.startswith(
        "nvlink.crc_flit rose 1150 in 10 min, above 1000/h over any 1h (rule nvlink-crc-rising)"
    ), gpu.last_error


def test_suspect_clears_when_the_reading_does(node, client):
    post_beat(client, node, _on_gpu0(signals_beat(), clock_event_reasons=["hw_thermal_slowdown"]))
    assert GPU.objects.get(node=node, index=0).health == GpuHealth.DEGRADED
    post_beat(client, node, signals_beat())
    gpu = GPU.objects.get(node=node, index=0)
    assert (gpu.health, gpu.last_error) == (GpuHealth.OK, "")


def test_a_node_drained_by_a_rule_takes_no_new_work_and_is_drained_when_its_job_ends(
    node, client, submitter, django_capture_on_commit_callbacks
):
    job = submit_job(submitter, JobSpec(name="train", tenant="llm", num_gpus=4))
    apply_placement(submitter, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")
    start_job(None, job.pk)
    post_beat(client, node, _on_gpu0(signals_beat(), remapped_rows__pending=True))
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING
    assert node.state_reason.startswith("GPU 0: remapped_rows.pending is set (rule remap-pending)")
    newcomer = submit_job(submitter, JobSpec(name="next", tenant="llm", num_gpus=4, locality="required"))
    schedule_pass()
    newcomer.refresh_from_db()
    assert not newcomer.allocations.filter(gpu__node=node).exists()
    with django_capture_on_commit_callbacks(execute=True):
        finish_job(None, job.pk, succeeded=True, reason="finished")
    node.refresh_from_db()
    assert node.state == NodeState.DRAINED


def test_operators_change_the_rules_and_every_change_is_audited(node, client, operator_client, viewer_client):
    assert {r["name"] for r in viewer_client.get("/api/health-rules/").json()} >= {
        "remap-pending",
        "hw-slowdown",
    }
    created = viewer_client.post(
        "/api/health-rules/",
        {"name": "hot", "signal": "temperature_c", "test": "above", "threshold": 85, "verdict": "suspect"},
        format="json",
    )
    assert created.status_code == 403
    bad = operator_client.post(
        "/api/health-rules/",
        {
            "name": "hot",
            "signal": "temperature_c",
            "test": "rate_above",
            "threshold": 85,
            "verdict": "suspect",
        },
        format="json",
    )
    assert bad.status_code == 400 and bad.json() == {"test": ["temperature_c can be tested with above"]}
    unknown = operator_client.post(
        "/api/health-rules/", {"name": "x", "signal": "mood", "test": "set", "verdict": "fail"}, format="json"
    )
    assert unknown.status_code == 400 and "signal" in unknown.json()
    hot = {"name": "hot", "signal": "temperature_c", "test": "above", "threshold": 85, "verdict": "suspect"}
    assert operator_client.post("/api/health-rules/", hot, format="json").status_code == 201
    assert operator_client.post("/api/health-rules/", hot, format="json").status_code == 409
    # A 90 C GPU is suspect; raise the threshold and the same reading is fine.
    beat = signals_beat()
    beat["gpus"][0]["temperature_c"] = 90.0
    post_beat(client, node, beat)
    assert GPU.objects.get(node=node, index=0).last_error == "temperature_c is 90 (rule hot: above 85)"
    changed = operator_client.patch("/api/health-rules/hot/", {"threshold": 95}, format="json")
    assert changed.status_code == 200 and changed.json()["threshold"] == 95
    beat["gpus"][0]["temperature_c"] = 90.5  # a new reading is stored when a flag changes or a minute passes
    beat["gpus"][0]["signals"]["clock_event_reasons"] = []
    post_beat(client, node, beat)
    assert GPU.objects.get(node=node, index=0).health == GpuHealth.OK
    assert operator_client.delete("/api/health-rules/hot/").status_code == 204
    assert operator_client.delete("/api/health-rules/hot/").status_code == 404
    actions = list(
        AuditEvent.objects.filter(action__startswith="health_rule.").values_list("action", flat=True)
    )
    assert sorted(actions) == ["health_rule.create", "health_rule.delete", "health_rule.update"]
