"""Event webhooks: operators register endpoints; job placements, node failures
and action decisions reach them as HMAC-signed POSTs that a real HTTP receiver
verifies; failures retry with growing backoff and end dead; a dead endpoint
never delays placement; only operators manage them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.utils import timezone

from fleet import signing
from fleet.choices import ActionKind, ActionState, DeliveryState, JobState, WebhookEvent
from fleet.executors import DONE
from fleet.models import AuditEvent, Job, Node, WebhookDelivery, WebhookEndpoint
from fleet.services import actions as action_services
from fleet.services import scheduling
from fleet.services import webhooks as webhook_services
from fleet.services.jobs import JobSpec, apply_placement, start_job, submit_job
from fleet.tasks import sweep_webhooks
from tests.support import Worker, flush_broker, wait_for


class Receiver:
    """A real HTTP server on 127.0.0.1 that checks every request's signature
    with ``fleet.signing.verify`` and answers ``status`` after ``delay`` s."""

    def __init__(self) -> None:
        self.secret = ""
        self.status = 200
        self.delay = 0.0
        self.requests: list[dict] = []
        self.release = threading.Event()  # cuts a slow answer short at teardown
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append(
                    {
                        "event": self.headers.get("X-Rackwise-Event"),
                        "delivery": self.headers.get("X-Rackwise-Delivery"),
                        "valid": signing.verify(receiver.secret, body, self.headers.get(signing.HEADER)),
                        "body": json.loads(body),
                    }
                )
                if receiver.delay:
                    receiver.release.wait(receiver.delay)
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok" if receiver.status < 300 else b"receiver says no")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self, event_type: str) -> list[dict]:
        return [r for r in self.requests if r["event"] == event_type]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def _subscribe(operator, receiver: Receiver, *events: str) -> WebhookEndpoint:
    endpoint = webhook_services.create_endpoint(operator, url=receiver.url, event_types=list(events))
    receiver.secret = endpoint.secret
    return endpoint


def _deliver_all() -> list[str]:
    """What the webhooks worker does, in this process: attempt every open delivery."""
    ids = (
        WebhookDelivery.objects.filter(state__in=[DeliveryState.PENDING])
        .order_by("id")
        .values_list("pk", flat=True)
    )
    return [webhook_services.attempt_delivery(pk).message for pk in ids]


class InstantExecutor:
    """Carries out every step at once (the database side is the real service)."""

    def perform(self, action, index, step) -> str:
        return DONE

    def after_step(self, action, index, step) -> None:
        return None


def _running_job(submitter, rack, slots: range) -> Job:
    job = submit_job(submitter, JobSpec(name="train", num_nodes=len(slots), gpus_per_node=4, tenant="llm"))
    nodes = Node.objects.filter(rack=rack, slot__in=list(slots))
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


# --- events reach the receiver, signed ---------------------------------------------


def test_a_job_placed_by_the_scheduler_reaches_the_receiver_with_a_valid_signature(
    fleet, operator, submitter_client, receiver
):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    response = submitter_client.post(
        "/api/jobs/", {"name": "llama", "num_nodes": 4, "gpus_per_node": 4, "tenant": "llm"}, format="json"
    )
    job_id = response.json()["id"]
    scheduling.schedule_pass()

    assert _deliver_all() == ["succeeded"]
    (request,) = receiver.requests
    assert request["valid"], "the receiver must be able to verify the signature with the endpoint's secret"
    assert request["event"] == "job.placed"
    body = request["body"]
    assert body["type"] == "job.placed"
    assert body["data"]["job"]["id"] == job_id
    assert body["data"]["job"]["tenant"] == "llm"
    assert body["data"]["job"]["state"] == JobState.PLACED
    assert len(body["data"]["job"]["placement"]["racks"]) == 1
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert request["delivery"] == str(delivery.pk)
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == (DeliveryState.SUCCEEDED, 1, 200)
    assert delivery.delivered_at is not None and delivery.last_duration_ms is not None


def test_a_signature_made_with_another_secret_does_not_verify(fleet, operator, receiver):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    webhook_services.send_test(operator, endpoint.pk)
    receiver.secret = "not-the-secret"
    _deliver_all()
    assert receiver.requests and not receiver.requests[0]["valid"]


def test_a_failed_node_sends_node_failed_naming_the_interrupted_job(
    fleet, operator, operator_client, submitter, receiver
):
    _subscribe(operator, receiver, WebhookEvent.NODE_FAILED)
    job = _running_job(submitter, fleet[0], range(4))
    node = Node.objects.get(rack=fleet[0], slot=2)

    response = operator_client.post(f"/api/nodes/{node.pk}/mark-failed/", {"reason": "XID 79"}, format="json")
    assert response.status_code == 200
    _deliver_all()

    (request,) = receiver.events("node.failed")
    assert request["valid"]
    data = request["body"]["data"]
    assert data["node"]["hostname"] == node.hostname
    assert data["node"]["rack"] == "r1"
    assert data["node"]["state"] == "failed"
    assert data["jobs_interrupted"] == [job.pk]


def test_an_action_sends_proposed_approved_and_finished_with_its_final_state(
    fleet, operator, operator_client, receiver
):
    _subscribe(operator, receiver, "action.proposed", "action.approved", "action.finished")
    node = Node.objects.get(rack=fleet[0], slot=5)
    with transaction.atomic():
        action = action_services.propose(
            kind=ActionKind.DRAIN,
            title="drain for maintenance",
            steps=[{"op": "drain", "node": node.pk}],
            jobs=[],
        )
    assert action.state == ActionState.PROPOSED
    assert (
        operator_client.post(f"/api/actions/{action.pk}/approve/", {"note": "go"}, format="json").status_code
        == 200
    )
    while action_services.execute_next_step(action.pk, executor=InstantExecutor()).more:
        pass

    _deliver_all()
    assert [r["event"] for r in receiver.requests] == [
        "action.proposed",
        "action.approved",
        "action.finished",
    ]
    assert all(r["valid"] for r in receiver.requests)
    states = [r["body"]["data"]["action"]["state"] for r in receiver.requests]
    assert states == ["proposed", "approved", "succeeded"]
    approved = receiver.requests[1]["body"]["data"]["action"]
    assert (approved["decided_by"], approved["decision_note"]) == ("olga", "go")
    finished = receiver.requests[2]["body"]["data"]["action"]
    assert finished["steps_done"] == finished["steps"] == 1 and finished["finished_at"]


def test_a_rejected_action_finishes_with_state_rejected(fleet, operator, operator_client, receiver):
    _subscribe(operator, receiver, "action.finished")
    node = Node.objects.get(rack=fleet[0], slot=5)
    with transaction.atomic():
        action = action_services.propose(
            kind=ActionKind.DRAIN, title="drain", steps=[{"op": "drain", "node": node.pk}], jobs=[]
        )
    operator_client.post(f"/api/actions/{action.pk}/reject/", {"note": "not now"}, format="json")
    _deliver_all()
    (request,) = receiver.events("action.finished")
    assert request["body"]["data"]["action"]["state"] == "rejected"


def test_an_automatic_placement_is_proposed_and_approved_by_the_policy(fleet, operator, submitter, receiver):
    _subscribe(operator, receiver, "action.proposed", "action.approved")
    job = submit_job(submitter, JobSpec(name="small", num_gpus=2, tenant="llm"))
    scheduling.schedule_pass()
    _deliver_all()
    assert [r["event"] for r in receiver.requests] == ["action.proposed", "action.approved"]
    approved = receiver.requests[1]["body"]["data"]["action"]
    assert approved["kind"] == ActionKind.PLACEMENT and approved["jobs"] == [job.pk]
    assert approved["decided_by"] == "policy (auto)"


def test_one_event_has_one_id_across_endpoints_and_skips_unsubscribed_and_inactive_ones(
    fleet, operator, receiver
):
    a = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    b = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED, WebhookEvent.NODE_FAILED)
    _subscribe(operator, receiver, WebhookEvent.NODE_FAILED)
    inactive = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    webhook_services.update_endpoint(operator, inactive.pk, active=False)
    with transaction.atomic():
        assert webhook_services.emit("job.placed", {"job": {"id": 1}}) == 2
    rows = list(WebhookDelivery.objects.all())
    assert {d.endpoint_id for d in rows} == {a.pk, b.pk}
    assert len({d.event_id for d in rows}) == 1


def test_an_event_whose_transaction_rolls_back_is_never_sent(fleet, operator, receiver):
    _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with pytest.raises(RuntimeError), transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 1}})
        raise RuntimeError("the change fails after the event was recorded")
    assert not WebhookDelivery.objects.exists()


def test_an_event_nobody_subscribes_to_costs_no_payload(fleet):
    def explode() -> dict:
        raise AssertionError("the payload must not be built when nobody listens")

    with transaction.atomic():
        assert webhook_services.emit("node.failed", explode) == 0


# --- retries, backoff, dead ----------------------------------------------------------


def test_a_failing_endpoint_is_retried_with_growing_backoff_and_ends_dead(
    fleet, operator, receiver, settings
):
    settings.RACKWISE_WEBHOOK_MAX_ATTEMPTS = 4
    settings.RACKWISE_WEBHOOK_BACKOFF_S = 10
    receiver.status = 500
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)

    waits = []
    for attempt in range(1, 5):
        due = delivery.next_attempt_at
        outcome = webhook_services.attempt_delivery(delivery.pk, now=due)
        delivery.refresh_from_db()
        assert delivery.attempts == attempt
        assert delivery.last_status_code == 500 and "receiver says no" in delivery.last_error
        if attempt < 4:
            assert delivery.state == DeliveryState.RETRYING
            assert outcome.retry_in is not None
            waits.append((delivery.next_attempt_at - due).total_seconds())
            # Not due yet: a duplicate task sends nothing.
            assert webhook_services.attempt_delivery(delivery.pk, now=due).message == "not due"
    assert delivery.state == DeliveryState.DEAD and delivery.next_attempt_at is None
    assert len(receiver.requests) == 4 and all(r["valid"] for r in receiver.requests)
    assert waits == sorted(waits) and waits[0] >= 8 and waits[-1] >= 3 * 8, waits
    assert webhook_services.attempt_delivery(delivery.pk).message == DeliveryState.DEAD


def test_an_unreachable_endpoint_is_recorded_and_retried(fleet, operator, receiver):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    receiver.stop()
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    _deliver_all()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.state == DeliveryState.RETRYING
    assert delivery.last_status_code is None and "Connection refused" in delivery.last_error


def test_the_sweep_finds_overdue_deliveries_only(fleet, operator, receiver):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit_many("job.placed", [{"job": {"id": i}} for i in range(3)])
    overdue, future, done = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id")
    now = timezone.now()
    WebhookDelivery.objects.filter(pk=overdue.pk).update(next_attempt_at=now - timedelta(minutes=5))
    WebhookDelivery.objects.filter(pk=future.pk).update(
        state=DeliveryState.RETRYING, next_attempt_at=now + timedelta(minutes=5)
    )
    WebhookDelivery.objects.filter(pk=done.pk).update(state=DeliveryState.SUCCEEDED, next_attempt_at=None)
    assert webhook_services.due_deliveries(now) == [overdue.pk]


def test_the_sweep_queues_an_overdue_delivery_on_the_webhooks_queue_once_not_every_sweep(
    fleet, operator, receiver
):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 1}})
    WebhookDelivery.objects.filter(endpoint=endpoint).update(
        next_attempt_at=timezone.now() - timedelta(minutes=5)
    )
    flush_broker()
    broker = redis.Redis.from_url(django_settings.REDIS_URL)

    assert sweep_webhooks() == "1 overdue, 1 queued"
    assert sweep_webhooks() == "1 overdue, 0 queued"
    assert broker.llen("webhooks") == 1 and broker.llen("celery") == 0
    flush_broker()


@pytest.mark.django_db(transaction=True)
def test_two_workers_attempting_one_delivery_at_once_send_it_once(fleet, operator, receiver):
    receiver.delay = 0.5
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def attempt() -> None:
        start.wait()
        try:
            outcomes.append(webhook_services.attempt_delivery(delivery.pk).message)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(receiver.requests) == 1
    assert "succeeded" in outcomes and len(outcomes) == 2
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == (DeliveryState.SUCCEEDED, 1)


# --- with real workers ---------------------------------------------------------------

WEBHOOK_ENV = {
    "RACKWISE_WEBHOOK_DELIVERY_TIMEOUT_S": "4",
    "RACKWISE_WEBHOOK_MAX_ATTEMPTS": "2",
    "RACKWISE_WEBHOOK_BACKOFF_S": "0.5",
}


@pytest.fixture
def two_workers() -> Iterator[None]:
    """The scheduler's worker on the default queue and a webhooks worker, as
    ``scripts/run`` starts them."""
    flush_broker()
    started = []
    try:
        started.append(Worker(WEBHOOK_ENV, concurrency=1, queues="celery").start())
        started.append(Worker(WEBHOOK_ENV, concurrency=1, queues="webhooks").start())
        yield
    finally:
        for w in started:
            w.stop()


def _submit(client, name: str) -> int:
    response = client.post(
        "/api/jobs/", {"name": name, "num_nodes": 2, "gpus_per_node": 4, "tenant": "llm"}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.mark.django_db(transaction=True)
def test_workers_deliver_a_signed_job_placed_event_end_to_end(
    fleet, operator, submitter_client, receiver, two_workers
):
    _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    job_id = _submit(submitter_client, "e2e")
    wait_for(lambda: receiver.events("job.placed"), 30, "the job.placed webhook")
    (request,) = receiver.events("job.placed")
    assert request["valid"] and request["body"]["data"]["job"]["id"] == job_id
    wait_for(
        lambda: WebhookDelivery.objects.filter(state=DeliveryState.SUCCEEDED).exists(),
        10,
        "the delivery recorded",
    )


@pytest.mark.django_db(transaction=True)
def test_a_dead_endpoint_does_not_delay_placement(fleet, operator, submitter_client, receiver, two_workers):
    receiver.delay = 30  # far past the 4 s delivery timeout: the endpoint hangs
    _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    first = _submit(submitter_client, "first")
    wait_for(lambda: receiver.requests, 30, "the webhooks worker to be stuck on the hanging endpoint")

    started = time.monotonic()
    second = _submit(submitter_client, "second")
    wait_for(
        lambda: Job.objects.filter(pk=second, state__in=[JobState.PLACED, JobState.RUNNING]).exists(),
        30,
        "placement",
    )
    took = time.monotonic() - started
    placed_event = WebhookDelivery.objects.get(event_type="job.placed", payload__data__job__id=second)
    assert placed_event.state in (DeliveryState.PENDING, DeliveryState.RETRYING)
    assert took < 4, f"placement took {took:.1f} s while the webhook endpoint hung"
    assert not WebhookDelivery.objects.filter(state=DeliveryState.SUCCEEDED).exists()
    assert Job.objects.get(pk=first).state in (JobState.PLACED, JobState.RUNNING, JobState.COMPLETED)
    # The hanging attempts time out, are retried, and end dead.
    wait_for(
        lambda: WebhookDelivery.objects.filter(pk=placed_event.pk, state=DeliveryState.DEAD).exists(),
        60,
        "the delivery to the hanging endpoint to end dead",
    )
    dead = WebhookDelivery.objects.get(pk=placed_event.pk)
    assert dead.attempts == 2 and "timed out" in dead.last_error.lower()


# --- the API --------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer_client", "submitter_client", "outsider_client"])
def test_only_operators_may_see_or_manage_webhooks(fleet, persona, request, operator):
    client = request.getfixturevalue(persona)
    endpoint = webhook_services.create_endpoint(
        operator, url="https://hooks.example.com/x", event_types=["job.placed"]
    )
    assert client.get("/api/webhooks/").status_code == 403
    assert (
        client.post(
            "/api/webhooks/", {"url": "https://a.example.com", "event_types": ["job.placed"]}, format="json"
        ).status_code
        == 403
    )
    assert client.post(f"/api/webhooks/{endpoint.pk}/rotate-secret/").status_code == 403
    assert client.get("/api/webhook-deliveries/").status_code == 403


def test_anonymous_requests_get_401(fleet, anon_client):
    assert anon_client.get("/api/webhooks/").status_code == 401
    assert anon_client.post("/api/webhooks/", {}, format="json").status_code == 401


def test_an_operator_registers_an_endpoint_and_sees_the_secret_once(fleet, operator, operator_client):
    response = operator_client.post(
        "/api/webhooks/",
        {
            "url": "https://hooks.example.com/rackwise",
            "event_types": ["job.placed", "node.failed"],
            "description": "pager",
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    created = response.json()
    assert len(created["secret"]) >= 32 and created["created_by"] == "olga"
    assert created["event_types"] == ["job.placed", "node.failed"]
    assert WebhookEndpoint.objects.get(pk=created["id"]).secret == created["secret"]
    listed = operator_client.get("/api/webhooks/").json()["results"]
    assert [e["id"] for e in listed] == [created["id"]] and "secret" not in listed[0]
    assert "secret" not in operator_client.get(f"/api/webhooks/{created['id']}/").json()
    assert AuditEvent.objects.filter(action="webhook.create", object_id=str(created["id"])).exists()

    rotated = operator_client.post(f"/api/webhooks/{created['id']}/rotate-secret/").json()
    assert rotated["secret"] != created["secret"]
    assert WebhookEndpoint.objects.get(pk=created["id"]).secret == rotated["secret"]


def test_an_operator_changes_and_deletes_an_endpoint(fleet, operator, operator_client):
    endpoint = webhook_services.create_endpoint(
        operator, url="https://hooks.example.com/x", event_types=["job.placed"]
    )
    response = operator_client.patch(f"/api/webhooks/{endpoint.pk}/", {"active": False}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["active"] is False and response.json()["event_types"] == ["job.placed"]
    assert operator_client.delete(f"/api/webhooks/{endpoint.pk}/").status_code == 204
    assert not WebhookEndpoint.objects.exists()
    assert AuditEvent.objects.filter(action="webhook.delete").exists()


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"url": "ftp://hooks.example.com/x", "event_types": ["job.placed"]}, "url", "http:// or https://"),
        ({"url": "not a url", "event_types": ["job.placed"]}, "url", "http:// or https://"),
        (
            {"url": "https://hooks.example.com", "event_types": ["job.placed", "job.exploded"]},
            "event_types",
            "'job.exploded'",
        ),
        ({"url": "https://hooks.example.com", "event_types": []}, "event_types", "non-empty"),
        ({"url": "https://hooks.example.com"}, "event_types", "required"),
    ],
)
def test_bad_input_is_refused_with_400_naming_the_field(fleet, operator_client, body, field, words):
    response = operator_client.post("/api/webhooks/", body, format="json")
    assert response.status_code == 400, response.content
    message = " ".join(response.json()[field])
    assert words in message
    assert not WebhookEndpoint.objects.exists()


def test_an_unknown_event_type_400_lists_the_valid_ones(fleet, operator_client):
    response = operator_client.post(
        "/api/webhooks/", {"url": "https://h.example.com", "event_types": ["job.exploded"]}, format="json"
    )
    message = response.json()["event_types"][0]
    assert all(t in message for t in WebhookEvent.values), message


def test_the_test_button_sends_a_signed_ping(fleet, operator, operator_client, receiver):
    endpoint = _subscribe(operator, receiver, WebhookEvent.NODE_FAILED)
    response = operator_client.post(f"/api/webhooks/{endpoint.pk}/test/")
    assert response.status_code == 202 and response.json()["event_type"] == "ping"
    _deliver_all()
    (request,) = receiver.requests
    assert request["event"] == "ping" and request["valid"]
    assert request["body"]["data"]["webhook"] == endpoint.pk


def test_delivery_history_is_paginated_newest_first(fleet, operator, operator_client, receiver):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        for i in range(3):
            webhook_services.emit("job.placed", {"job": {"id": i}})
    page = operator_client.get(f"/api/webhooks/{endpoint.pk}/deliveries/?limit=2").json()
    assert page["count"] == 3 and page["next"]
    assert [d["payload"]["data"]["job"]["id"] for d in page["results"]] == [2, 1]
    assert page["results"][0]["state"] == "pending"


def test_a_finished_delivery_can_be_redelivered_but_an_open_one_cannot(
    fleet, operator, operator_client, receiver
):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 3}})
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert operator_client.post(f"/api/webhook-deliveries/{delivery.pk}/redeliver/").status_code == 409
    _deliver_all()
    response = operator_client.post(f"/api/webhook-deliveries/{delivery.pk}/redeliver/")
    assert response.status_code == 202
    again = response.json()
    assert (
        again["id"] != delivery.pk
        and again["event_id"] == str(delivery.event_id)
        and again["state"] == "pending"
    )
    _deliver_all()
    assert [r["body"]["id"] for r in receiver.requests] == [str(delivery.event_id)] * 2


# --- the console page ----------------------------------------------------------------


def test_operators_see_the_webhooks_page_and_viewers_are_refused(fleet, operator, viewer, client, receiver):
    endpoint = _subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    webhook_services.send_test(operator, endpoint.pk)
    client.force_login(operator)
    page = client.get("/webhooks/")
    assert page.status_code == 200
    html = page.content.decode()
    assert receiver.url in html and "ping" in html and endpoint.secret not in html
    assert 'data-testid="nav-webhooks"' in html
    client.force_login(viewer)
    assert client.get("/webhooks/").status_code == 403
    assert 'data-testid="nav-webhooks"' not in client.get("/jobs/").content.decode()
