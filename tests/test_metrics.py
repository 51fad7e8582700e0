"""/metrics: the fleet in the Prometheus text format, read back with the official
client's parser, its access rules, and the Grafana dashboard built on it."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet.choices import ActionKind, ActionState
from fleet.models import Action, Job, Node
from fleet.services.decisions.defrag import fragmentation_report
from fleet.services.intake.health import record_heartbeat
from fleet.services.jobs.submit import JobSpec, submit_job
from rackwise.celery import app as celery_app
from tests.signals_support import signals_beat
from tests.support import flush_broker

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "rackwise-dashboard.json"


def scrape(client: Client | None = None, **extra) -> dict[str, dict[tuple, float]]:
    """Scrape /metrics and parse it: sample name -> {sorted label items: value}."""
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def one(samples, name: str, **labels) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture(autouse=True)
def empty_broker():
    flush_broker()
    yield
    flush_broker()


def test_gpu_states_and_utilization_match_the_fleet(fragmented):
    samples = scrape()

    # Jobs a and b hold 4 nodes x 4 GPUs each of the 144.
    assert one(samples, "rackwise_gpus", state="used") == 32
    assert one(samples, "rackwise_gpus", state="free") == 112
    assert one(samples, "rackwise_gpus", state="failed") == 0
    assert one(samples, "rackwise_gpus_total") == 144
    assert one(samples, "rackwise_nodes", state="healthy") == 36
    assert one(samples, "rackwise_racks") == 2
    assert one(samples, "rackwise_utilization") == pytest.approx(32 / 144, abs=1e-4)


def test_fragmentation_and_the_largest_placeable_job_are_the_engines_figures(fragmented):
    samples = scrape()

    # The typical multi-node job (by GPU demand of a, b and the waiting c) is c's
    # 16 nodes. r1 offers its 14 idle nodes (the preemptible a has borrowed its
    # spares), r2 12 (2 spares kept, not counted): neither holds 16, so every
    # counted GPU is fragmented, and r1's 14 nodes are the largest free slice.
    assert one(samples, "rackwise_fragmentation") == pytest.approx(1.0)
    assert one(samples, "rackwise_fragmented_gpus") == pytest.approx(56 + 48)
    assert one(samples, "rackwise_largest_placeable_job_gpus") == 56
    assert one(samples, "rackwise_fragmentation") == pytest.approx(fragmentation_report().fraction)


def test_pending_jobs_are_counted_by_shape(fragmented, submitter):
    for _ in range(2):
        submit_job(submitter, JobSpec(name="small", num_gpus=2, tenant="llm"))

    samples = scrape()

    assert samples["rackwise_pending_jobs"] == {
        (("gpus", "64"), ("nodes", "16")): 1,
        (("gpus", "2"), ("nodes", "1")): 2,
    }
    assert one(samples, "rackwise_jobs", state="pending") == 3
    assert one(samples, "rackwise_jobs", state="running") == 2


def test_the_wait_histogram_puts_each_placed_job_in_its_cumulative_buckets(fragmented):
    a, b, _c = fragmented
    # Jobs a and b were placed at once; say they waited 90 s and 2 h.
    Job.objects.filter(pk=a.pk).update(submitted_at=a.placed_at - timedelta(seconds=90))
    Job.objects.filter(pk=b.pk).update(submitted_at=b.placed_at - timedelta(hours=2))

    samples = scrape()

    def bucket(le: str) -> float:
        return one(samples, "rackwise_job_wait_seconds_bucket", le=le)

    assert bucket("60.0") == 0
    assert bucket("120.0") == 1
    assert bucket("3600.0") == 1
    assert bucket("7200.0") == 2
    assert bucket("+Inf") == 2
    assert one(samples, "rackwise_job_wait_seconds_count") == 2
    assert one(samples, "rackwise_job_wait_seconds_sum") == pytest.approx(90 + 7200)


def test_actions_are_counted_by_kind_and_state_and_finished_recoveries_by_outcome(fleet):
    def action(kind, state):
        Action.objects.create(kind=kind, state=state, title=f"{kind} {state}")

    action(ActionKind.DEFRAG, ActionState.PROPOSED)
    action(ActionKind.RECOVERY, ActionState.SUCCEEDED)
    action(ActionKind.RECOVERY, ActionState.SUCCEEDED)
    action(ActionKind.MIGRATION, ActionState.FAILED)
    action(ActionKind.RECOVERY, ActionState.EXECUTING)

    samples = scrape()

    assert one(samples, "rackwise_actions", kind="defrag", state="proposed") == 1
    assert one(samples, "rackwise_actions", kind="recovery", state="succeeded") == 2
    assert one(samples, "rackwise_actions", kind="placement", state="succeeded") == 0
    assert one(samples, "rackwise_recoveries_total", kind="recovery", state="succeeded") == 2
    assert one(samples, "rackwise_recoveries_total", kind="migration", state="failed") == 1
    # An executing recovery has not finished; a defrag plan is no recovery.
    assert sum(samples["rackwise_recoveries_total"].values()) == 3


def test_heartbeat_age_is_reported_per_node_that_has_heartbeated(fleet):
    node = Node.objects.get(hostname="r2-n07")
    record_heartbeat(node.pk, {"gpus": [{"index": i, "state": "ok"} for i in range(4)]})
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=45))

    samples = scrape()

    ages = samples["rackwise_node_heartbeat_age_seconds"]
    assert list(ages) == [(("node", "r2-n07"), ("rack", "r2"))]
    assert 45 <= one(samples, "rackwise_node_heartbeat_age_seconds", node="r2-n07", rack="r2") < 60


def test_queue_depth_counts_the_messages_waiting_on_the_broker(fleet):
    for _ in range(3):
        celery_app.send_task("fleet.tasks.schedule_pending")  # no worker runs: they wait
    celery_app.send_task("fleet.tasks.reconcile")
    celery_app.send_task("fleet.tasks.sample_fleet")

    samples = scrape()

    assert one(samples, "rackwise_task_queue_depth", queue="scheduler") == 3  # its route
    assert one(samples, "rackwise_task_queue_depth", queue="control") == 1  # reconcile's own queue
    assert one(samples, "rackwise_task_queue_depth", queue="celery") == 1
    assert one(samples, "rackwise_broker_up") == 1


def test_a_broker_that_does_not_answer_leaves_queue_depth_out_but_the_rest_is_served(fleet, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"

    samples = scrape()

    assert one(samples, "rackwise_broker_up") == 0
    assert "rackwise_task_queue_depth" not in samples
    assert one(samples, "rackwise_gpus_total") == 144


# --- access -----------------------------------------------------------------------


def test_loopback_scrapers_need_nothing_by_default(fleet, settings):
    assert settings.RACKWISE_METRICS_TOKEN == ""

    response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1")

    assert response.status_code == 200  # not a redirect to the login page


def test_another_address_is_refused_with_403_when_no_token_is_configured(fleet):
    response = Client().get("/metrics", REMOTE_ADDR="10.1.2.3")

    assert response.status_code == 403
    assert "RACKWISE_METRICS_ALLOW" in response.content.decode()


def test_a_logged_in_operator_is_no_scraper(fleet, operator):
    client = Client()
    client.force_login(operator)

    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403


def test_an_allowed_network_may_scrape(fleet, settings):
    settings.RACKWISE_METRICS_ALLOW = ["10.0.0.0/8"]

    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403


def test_with_a_token_configured_a_stranger_must_present_it(fleet, settings):
    settings.RACKWISE_METRICS_TOKEN = "s3cret-token"

    missing = Client().get("/metrics", REMOTE_ADDR="10.1.2.3")
    wrong = Client().get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer nope")
    right = scrape(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-token")

    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert wrong.status_code == 401
    assert "wrong" in wrong.content.decode()
    assert one(right, "rackwise_gpus_total") == 144


def test_a_malformed_allow_list_stops_start_up_naming_the_variable(monkeypatch):
    from rackwise.env import env_cidrs

    monkeypatch.setenv("RACKWISE_METRICS_ALLOW", "10.0.0.0/8, not-a-network")

    with pytest.raises(ImproperlyConfigured, match="RACKWISE_METRICS_ALLOW entry 'not-a-network'"):
        env_cidrs("RACKWISE_METRICS_ALLOW", [])
    monkeypatch.setenv("RACKWISE_METRICS_ALLOW", "10.1.2.3, ::1")
    assert env_cidrs("RACKWISE_METRICS_ALLOW", []) == ["10.1.2.3/32", "::1/128"]


# --- Grafana ----------------------------------------------------------------------


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_the_grafana_dashboard_is_importable_json_with_a_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())

    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_every_metric_the_dashboard_queries_is_served(fragmented, default_health_rules):
    node = Node.objects.get(hostname="r1-n10")
    # Signals too, with a clock event and a rule's verdict: every GPU health family has a series.
    record_heartbeat(node.pk, signals_beat(clock_event_reasons=["hw_slowdown"]))
    Action.objects.create(kind=ActionKind.RECOVERY, state=ActionState.SUCCEEDED, title="swap")
    Action.objects.create(kind=ActionKind.DEFRAG, state=ActionState.PROPOSED, title="plan")  # its age
    served = set(scrape())

    used = {name for expr in _dashboard_exprs() for name in re.findall(r"\brackwise_[a-z_]+", expr)}

    assert used, "the dashboard queries no rackwise metric"
    assert used <= served, f"the dashboard queries metrics /metrics does not serve: {sorted(used - served)}"
    # Every family is on the dashboard somewhere.
    families = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in served}
    shown = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    assert families <= shown, f"not on the dashboard: {sorted(families - shown)}"
