"""The webhooks API and console page: only operators manage endpoints; the
secret is shown once; bad input gets 400 naming the field; history, test pings
and redelivery."""

from __future__ import annotations

import pytest
from django.db import transaction

from fleet.choices import WebhookEvent
from fleet.models import AuditEvent, WebhookDelivery, WebhookEndpoint
from fleet.services import webhooks as webhook_services
from tests.webhook_receiver import deliver_all, subscribe

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


def test_every_bad_field_is_named_in_one_400(fleet, operator_client):
    response = operator_client.post(
        "/api/webhooks/", {"url": "ftp://x", "event_types": ["job.placd"]}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()) == {"url", "event_types"}


def test_an_unknown_event_type_400_lists_the_valid_ones(fleet, operator_client):
    response = operator_client.post(
        "/api/webhooks/", {"url": "https://h.example.com", "event_types": ["job.exploded"]}, format="json"
    )
    message = response.json()["event_types"][0]
    assert all(t in message for t in WebhookEvent.values), message


def test_the_test_button_sends_a_signed_ping(fleet, operator, operator_client, receiver):
    endpoint = subscribe(operator, receiver, WebhookEvent.NODE_FAILED)
    response = operator_client.post(f"/api/webhooks/{endpoint.pk}/test/")
    assert response.status_code == 202 and response.json()["event_type"] == "ping"
    deliver_all()
    (request,) = receiver.requests
    assert request["event"] == "ping" and request["valid"]
    assert request["body"]["data"]["webhook"] == endpoint.pk


def test_delivery_history_is_paginated_newest_first(fleet, operator, operator_client, receiver):
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
    with transaction.atomic():
        webhook_services.emit("job.placed", {"job": {"id": 3}})
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert operator_client.post(f"/api/webhook-deliveries/{delivery.pk}/redeliver/").status_code == 409
    deliver_all()
    response = operator_client.post(f"/api/webhook-deliveries/{delivery.pk}/redeliver/")
    assert response.status_code == 202
    again = response.json()
    assert (
        again["id"] != delivery.pk
        and again["event_id"] == str(delivery.event_id)
        and again["state"] == "pending"
    )
    deliver_all()
    assert [r["body"]["id"] for r in receiver.requests] == [str(delivery.event_id)] * 2


# --- the console page ----------------------------------------------------------------


def test_operators_see_the_webhooks_page_and_viewers_are_refused(fleet, operator, viewer, client, receiver):
    endpoint = subscribe(operator, receiver, WebhookEvent.JOB_PLACED)
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


def test_testing_an_inactive_endpoint_is_a_conflict(fleet, operator, operator_client):
    endpoint = webhook_services.create_endpoint(
        operator, url="https://hooks.example.com/x", event_types=["job.placed"], active=False
    )
    response = operator_client.post(f"/api/webhooks/{endpoint.pk}/test/")
    assert response.status_code == 409 and "inactive" in response.json()["detail"]
    assert not WebhookDelivery.objects.exists()


def test_a_full_update_replaces_the_subscription_and_is_validated(fleet, operator, operator_client):
    endpoint = webhook_services.create_endpoint(
        operator, url="https://hooks.example.com/x", event_types=["job.placed"]
    )
    body = {"url": "https://hooks.example.com/y", "event_types": ["node.failed"], "description": "ops"}
    response = operator_client.put(f"/api/webhooks/{endpoint.pk}/", body, format="json")
    assert response.status_code == 200, response.content
    endpoint.refresh_from_db()
    assert (endpoint.url, endpoint.event_types, endpoint.description) == (body["url"], ["node.failed"], "ops")
    bad = operator_client.patch(f"/api/webhooks/{endpoint.pk}/", {"event_types": ["job.done"]}, format="json")
    assert bad.status_code == 400 and "'job.done'" in bad.json()["event_types"][0]
    endpoint.refresh_from_db()
    assert endpoint.event_types == ["node.failed"]
