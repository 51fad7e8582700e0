"""Webhook targets: endpoints on loopback, link-local (the cloud metadata
service), private or unspecified addresses, or with credentials in the URL,
are refused at registration (400 naming the URL) and again at delivery, unless
RACKWISE_WEBHOOK_ALLOW_NETS allows their network; the request goes to the
address that was checked; the history keeps an answer's status and size, never
its words; the audit log shows scheme and host only."""

from __future__ import annotations

import pytest
from django.db import transaction

from fleet import signing
from fleet.choices import DeliveryState, WebhookEvent
from fleet.models import AuditEvent, WebhookDelivery, WebhookEndpoint
from fleet.services import webhook_targets
from fleet.services import webhooks as webhook_services
from tests.webhook_receiver import LOOPBACK_NET, deliver_all, subscribe


@pytest.fixture(autouse=True)
def nothing_allowed(settings):
    """The default: no network allowed beyond public addresses. Tests that need
    the loopback receiver allow it explicitly (the receiver fixture does)."""
    settings.RACKWISE_WEBHOOK_ALLOW_NETS = []


def register(client, url: str):
    return client.post("/api/webhooks/", {"url": url, "event_types": ["job.placed"]}, format="json")


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8000/hook", "loopback"),
        ("http://localhost:8000/hook", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.5/hook", "private"),
        ("https://192.168.1.20/hook", "private"),
        ("http://0.0.0.0:8000/", "unspecified"),
        ("http://[::1]:8000/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://100.64.0.1/", "not globally routable"),
    ],
)
def test_it_refuses_an_endpoint_on_an_internal_address_with_a_message_on_the_url(operator_client, url, kind):
    response = register(operator_client, url)

    assert response.status_code == 400
    (message,) = response.json()["url"]
    assert f"a {kind} address" in message and "RACKWISE_WEBHOOK_ALLOW_NETS" in message
    assert not WebhookEndpoint.objects.exists()


def test_it_refuses_credentials_in_the_url(operator_client):
    response = register(operator_client, "https://user:pass@hooks.example.com/x")

    assert response.status_code == 400
    assert "credentials in the URL" in response.json()["url"][0]


def test_it_refuses_an_internal_address_when_the_url_is_changed_too(operator, operator_client):
    endpoint = webhook_services.create_endpoint(
        operator, url="https://hooks.example.com/x", event_types=["job.placed"]
    )

    response = operator_client.patch(
        f"/api/webhooks/{endpoint.pk}/", {"url": "http://169.254.169.254/"}, format="json"
    )

    assert response.status_code == 400 and "link-local" in response.json()["url"][0]
    endpoint.refresh_from_db()
    assert endpoint.url == "https://hooks.example.com/x"


def test_an_allowed_network_may_be_registered(operator_client, settings):
    settings.RACKWISE_WEBHOOK_ALLOW_NETS = ["10.20.0.0/16"]

    assert register(operator_client, "http://10.20.3.4/hook").status_code == 201
    assert register(operator_client, "http://10.21.3.4/hook").status_code == 400


def test_a_name_that_does_not_resolve_yet_is_accepted_and_checked_at_delivery(operator_client):
    # (No DNS here: the delivery's own lookup decides, and a failed one retries.)
    assert register(operator_client, "https://hooks.example.com/rackwise").status_code == 201


def test_a_delivery_to_an_address_no_longer_allowed_is_refused_without_a_request(
    fleet, operator, receiver, settings
):
    """Registered while allowed; then the address is not (as when DNS now
    answers a private address): the delivery is dead and nothing is sent."""
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    settings.RACKWISE_WEBHOOK_ALLOW_NETS = []
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})

    (outcome,) = deliver_all()

    assert outcome.startswith("dead: refused: 127.0.0.1 is a loopback address")
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.state == DeliveryState.DEAD and delivery.last_status_code is None
    assert receiver.requests == []


def test_the_request_goes_to_the_checked_address_with_the_name_as_host(receiver):
    """The URL's name is not looked up again: connecting to the pinned address
    works even for a name that has no address at all here, and the receiver
    sees the name in Host."""
    port = receiver.server.server_address[1]

    answer = signing.post_signed(
        f"http://hooks.example.com:{port}/hook", "s", b"{}", timeout=5, connect_to="127.0.0.1"
    )

    assert answer.status == 200
    assert receiver.requests[0]["host"] == f"hooks.example.com:{port}"


def test_a_delivery_resolves_the_name_and_sends_it_as_host(fleet, operator, receiver, settings):
    port = receiver.server.server_address[1]
    endpoint = webhook_services.create_endpoint(
        operator, url=f"http://localhost:{port}/hook", event_types=[WebhookEvent.JOB_PLACED]
    )
    receiver.secret = endpoint.secret
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})

    assert deliver_all() == ["succeeded"]
    assert receiver.requests[0]["host"] == f"localhost:{port}" and receiver.requests[0]["valid"]


def test_the_history_keeps_the_status_and_size_of_an_answer_never_its_words(fleet, operator, receiver):
    receiver.status = 500  # it answers "receiver says no"
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 7}})
    deliver_all()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.last_error == "HTTP 500, 16 bytes"
    assert "receiver says no" not in str(WebhookDelivery.objects.values().get(pk=delivery.pk))


def test_the_audit_log_shows_a_webhook_url_as_scheme_and_host_only(operator, operator_client, viewer_client):
    secret_path = "https://hooks.example.com:8443/services/T000/B000/XXXXsecrettoken?key=abc"
    endpoint = webhook_services.create_endpoint(operator, url=secret_path, event_types=["job.placed"])
    webhook_services.update_endpoint(operator, endpoint.pk, url=secret_path + "2")
    webhook_services.delete_endpoint(operator, endpoint.pk)

    response = viewer_client.get("/api/audit/")

    assert response.status_code == 200
    assert "secrettoken" not in response.content.decode() and "abc" not in response.content.decode()
    snapshots = [e.after or e.before for e in AuditEvent.objects.filter(action__startswith="webhook.")]
    assert {s["url"] for s in snapshots} == {"https://hooks.example.com:8443"}


def test_the_loopback_receiver_of_the_tests_is_allowed_only_explicitly(settings):
    assert webhook_targets.refusal("127.0.0.1") is not None
    settings.RACKWISE_WEBHOOK_ALLOW_NETS = [LOOPBACK_NET]
    assert webhook_targets.refusal("127.0.0.1") is None
    assert webhook_targets.refusal("127.0.0.2") is not None
