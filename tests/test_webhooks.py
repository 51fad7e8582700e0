"""Event webhooks: operators register endpoints; job placements, node failures
and action decisions reach them as HMAC-signed POSTs that a real HTTP receiver
verifies; failures retry with growing backoff and end dead; a dead endpoint
never delays placement. The API and the console page: test_webhooks_api.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.utils import timezone

from fleet.choices import ActionKind, ActionState, DeliveryState, JobState, WebhookEvent
from fleet.models import Job, Node, WebhookDelivery
from fleet.services import webhooks as webhook_services
from fleet.services.actions import propose as action_services
from fleet.services.decisions import scheduling
from fleet.services.execution import execute as execution
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.tasks import sweep_webhooks
from tests.support import InstantAdapter, Worker, flush_broker, wait_for
from tests.webhook_receiver import ALLOW_LOOPBACK_ENV, deliver_all, subscribe


def _running_job(submitter, rack, slots: range) -> Job:
    job = submit_job(submitter, JobSpec(name="train", num_nodes=len(slots), gpus_per_node=4, tenant="llm"))
    nodes = Node.objects.filter(rack=rack, slot__in=list(slots))
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


# --- events reach the receiver, signed ---------------------------------------------


def test_a_job_placed_by_the_scheduler_reaches_the_receiver_with_a_valid_signature(
    fleet, operator, submitter_client, receiver
):
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    response = submitter_client.post(
        "/api/jobs/", {"name": "llama", "num_nodes": 4, "gpus_per_node": 4, "tenant": "llm"}, format="json"
    )
    job_id = response.json()["id"]
    scheduling.schedule_pass()

    assert deliver_all() == ["succeeded"]
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
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    webhook_services.send_test(operator, endpoint.pk)
    receiver.secret = "not-the-secret"
    deliver_all()
    assert receiver.requests and not receiver.requests[0]["valid"]


def test_a_failed_node_sends_node_failed_naming_the_interrupted_job(
    fleet, operator, operator_client, submitter, receiver
):
    subscribe(operator, receiver, WebhookEvent.NODE_FAILED)
    job = _running_job(submitter, fleet[0], range(4))
    node = Node.objects.get(rack=fleet[0], slot=2)

    response = operator_client.post(
        f"/api/nodes/{node.pk}/mark-failed/", {"reason": "XID 79", "confirm": True}, format="json"
    )
    assert response.status_code == 200
    deliver_all()

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
    subscribe(operator, receiver, "action.proposed", "action.approved", "action.finished")
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
    while execution.execute_next_step(action.pk, adapter=InstantAdapter()).more:
        pass

    deliver_all()
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
    subscribe(operator, receiver, "action.finished")
    node = Node.objects.get(rack=fleet[0], slot=5)
    with transaction.atomic():
        action = action_services.propose(
            kind=ActionKind.DRAIN, title="drain", steps=[{"op": "drain", "node": node.pk}], jobs=[]
        )
    operator_client.post(f"/api/actions/{action.pk}/reject/", {"note": "not now"}, format="json")
    deliver_all()
    (request,) = receiver.events("action.finished")
    assert request["body"]["data"]["action"]["state"] == "rejected"


def test_an_automatic_placement_is_proposed_and_approved_by_the_policy(fleet, operator, submitter, receiver):
    subscribe(operator, receiver, "action.proposed", "action.approved")
    job = submit_job(submitter, JobSpec(name="small", num_gpus=2, tenant="llm"))
    scheduling.schedule_pass()
    deliver_all()
    assert [r["event"] for r in receiver.requests] == ["action.proposed", "action.approved"]
    approved = receiver.requests[1]["body"]["data"]["action"]
    assert approved["kind"] == ActionKind.PLACEMENT and approved["jobs"] == [job.pk]
    assert approved["decided_by"] == "policy (auto)"


def test_one_event_has_one_id_across_endpoints_and_skips_unsubscribed_and_inactive_ones(
    fleet, operator, receiver
):
    a = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    b = subscribe(operator, receiver, WebhookEvent.JOB_PLACED, WebhookEvent.NODE_FAILED)
    subscribe(operator, receiver, WebhookEvent.NODE_FAILED)
    inactive = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    webhook_services.update_endpoint(operator, inactive.pk, active=False)
    with transaction.atomic():
        assert webhook_services.emit("job.placed", {"job": {"id": 1}}) == 2
    rows = list(WebhookDelivery.objects.all())
    assert {d.endpoint_id for d in rows} == {a.pk, b.pk}
    assert len({d.event_id for d in rows}) == 1


def test_an_event_whose_transaction_rolls_back_is_never_sent(fleet, operator, receiver):
    subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)

    waits = []
    for attempt in range(1, 5):
        due = delivery.next_attempt_at
        outcome = webhook_services.attempt_delivery(delivery.pk, now=due)
        delivery.refresh_from_db()
        assert delivery.attempts == attempt
        # Status and size only: the answer's words are never read back.
        assert delivery.last_status_code == 500 and delivery.last_error == "HTTP 500, 16 bytes"
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
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    receiver.stop()
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    deliver_all()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.state == DeliveryState.RETRYING
    assert delivery.last_status_code is None and "Connection refused" in delivery.last_error


def test_a_redirect_is_not_followed_but_retried(fleet, operator, receiver):
    receiver.status = 302
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    deliver_all()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (delivery.state, delivery.last_status_code) == (DeliveryState.RETRYING, 302)
    assert len(receiver.requests) == 1


def test_the_sweep_finds_overdue_deliveries_only(fleet, operator, receiver):
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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

WEBHOOK_ENV = ALLOW_LOOPBACK_ENV | {
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
        started.append(Worker(WEBHOOK_ENV, concurrency=1, queues="celery,scheduler,control").start())
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
    subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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
    subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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


def test_a_receiver_that_answers_a_byte_at_a_time_is_cut_off_at_the_timeout():
    """The timeout bounds the whole request, not each read: a receiver that
    trickles its answer held a worker indefinitely (#28 item 16)."""
    import socket

    from fleet import signing

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)  # each read well inside the timeout

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="timed out: no whole answer within 1 s"):
            signing.post_signed(f"http://127.0.0.1:{server.getsockname()[1]}/hook", "s", b"{}", timeout=1.0)
        assert time.monotonic() - started < 3
    finally:
        stop.set()
        server.close()
