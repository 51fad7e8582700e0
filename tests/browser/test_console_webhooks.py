"""The Webhooks page: an operator registers an endpoint (a bad URL is named next
to its field), copies the secret shown once, sends a test ping that a real
webhooks worker delivers to a real receiver checking the signature with that
secret; rotates the secret, redelivers a dead delivery, deactivates and deletes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet.models import WebhookDelivery, WebhookEndpoint
from tests.browser.helpers import log_in_as
from tests.support import Worker, flush_broker
from tests.webhook_receiver import ALLOW_LOOPBACK_ENV

pytestmark = pytest.mark.browser

SHOWN_ONCE = "copy it now; it will not be shown again"


@pytest.fixture
def webhooks_worker(transactional_db) -> Iterator[Worker]:
    """A worker on the webhooks queue only, as ``scripts/run`` starts it. One
    attempt per delivery, so a refused ping is dead at once and can be redelivered."""
    flush_broker()
    env = ALLOW_LOOPBACK_ENV | {"RACKWISE_WEBHOOK_MAX_ATTEMPTS": "1"}
    worker = Worker(env, concurrency=1, queues="webhooks").start()
    yield worker
    worker.stop()


def _open(page, operator) -> None:
    log_in_as(page, operator)
    page.goto("/webhooks/")
    page.wait_for_function("document.body.dataset.ready === '1'")


def _ping_row(card, state: str):
    return card.locator(f"[data-testid=delivery-row][data-event=ping][data-state={state}]")


def test_an_operator_registers_an_endpoint_sees_the_secret_once_and_a_test_ping_arrives_signed(
    page, operator, receiver, webhooks_worker
):
    _open(page, operator)
    assert page.locator("[data-testid=no-webhooks]").is_visible()
    form = page.locator("[data-testid=register-form]")

    # A bad URL: refused by the server, its message next to the URL field.
    form.locator("[data-testid=register-url]").fill("ftp://hooks.example.com/x")
    form.locator("[data-testid='register-event-node.failed']").check()
    form.locator("[data-testid=register-submit]").click()
    page.wait_for_function("document.querySelector('[data-testid=error-url]').textContent !== ''")
    assert "http:// or https://" in form.locator("[data-testid=error-url]").text_content()
    assert form.locator("[data-testid=error-event_types]").text_content() == ""
    assert not WebhookEndpoint.objects.exists()

    form.locator("[data-testid=register-url]").fill(receiver.url)
    form.locator("[data-testid=register-description]").fill("pager")
    form.locator("[data-testid=register-submit]").click()
    box = page.locator("[data-testid=register-secret] [data-testid=secret-once]")
    box.wait_for()
    assert SHOWN_ONCE in box.text_content()
    assert form.locator("[data-testid=error-url]").text_content() == ""
    endpoint = WebhookEndpoint.objects.get()
    shown = box.locator("[data-testid=secret]").text_content()
    assert shown == endpoint.secret and endpoint.event_types == ["node.failed"]
    receiver.secret = shown  # the receiver verifies signatures with what the page showed
    card = page.locator(f"[data-testid=webhook][data-webhook-id='{endpoint.pk}']")
    assert receiver.url in card.locator("[data-testid=webhook-url]").text_content()
    assert page.locator("[data-testid=no-webhooks]").is_hidden()

    card.locator("[data-testid=webhook-test]").click()
    _ping_row(card, "succeeded").wait_for(timeout=30000)
    (request,) = receiver.requests
    assert request["event"] == "ping" and request["valid"]
    assert card.locator("[data-testid=webhook-error]").text_content() == ""

    # Shown once: a fresh load of the page has the endpoint and its ping, not the secret.
    _open(page, operator)
    assert _ping_row(page.locator("[data-testid=webhook]"), "succeeded").count() == 1
    assert page.locator("[data-testid=secret-once]").count() == 0
    assert shown not in page.content()
    assert page.js_errors == []


def test_an_operator_rotates_the_secret_redelivers_a_dead_ping_deactivates_and_deletes(
    page, operator, receiver, webhooks_worker
):
    _open(page, operator)
    page.on("dialog", lambda dialog: dialog.accept())  # the confirm() of rotate and delete
    form = page.locator("[data-testid=register-form]")
    form.locator("[data-testid=register-url]").fill(receiver.url)
    form.locator("[data-testid='register-event-job.placed']").check()
    form.locator("[data-testid=register-submit]").click()
    page.locator("[data-testid=register-secret] [data-testid=secret]").wait_for()
    old = page.locator("[data-testid=register-secret] [data-testid=secret]").text_content()
    endpoint = WebhookEndpoint.objects.get()
    card = page.locator(f"[data-testid=webhook][data-webhook-id='{endpoint.pk}']")

    card.locator("[data-testid=webhook-rotate]").click()
    rotated = card.locator("[data-testid=webhook-secret] [data-testid=secret-once]")
    rotated.wait_for()
    new = rotated.locator("[data-testid=secret]").text_content()
    assert SHOWN_ONCE in rotated.text_content()
    assert new != old and new == WebhookEndpoint.objects.get().secret
    assert (
        page.locator("[data-testid=register-secret] [data-testid=secret-once]").count() == 0
    )  # the old one is void
    receiver.secret = new

    # The receiver refuses: with one attempt allowed the ping is dead, and can be sent again.
    receiver.status = 500
    card.locator("[data-testid=webhook-test]").click()
    _ping_row(card, "dead").wait_for(timeout=30000)
    receiver.status = 200
    _ping_row(card, "dead").locator("[data-testid=redeliver]").click()
    _ping_row(card, "succeeded").wait_for(timeout=30000)
    assert [r["valid"] for r in receiver.requests] == [True, True]
    assert len({r["body"]["id"] for r in receiver.requests}) == 1  # the same event, sent again
    assert WebhookDelivery.objects.count() == 2

    card.locator("[data-testid=webhook-toggle]").click()
    page.wait_for_function(
        f"document.querySelector('[data-webhook-id=\"{endpoint.pk}\"]').dataset.active === '0'"
    )
    assert card.locator("[data-testid=webhook-active]").text_content() == "inactive"
    assert card.locator("[data-testid=webhook-test]").is_disabled()
    assert WebhookEndpoint.objects.get().active is False
    card.locator("[data-testid=webhook-toggle]").click()
    page.wait_for_function(
        f"document.querySelector('[data-webhook-id=\"{endpoint.pk}\"]').dataset.active === '1'"
    )
    assert WebhookEndpoint.objects.get().active is True

    card.locator("[data-testid=webhook-delete]").click()
    card.wait_for(state="detached")
    assert page.locator("[data-testid=no-webhooks]").is_visible()
    assert not WebhookEndpoint.objects.exists()
    assert page.js_errors == []
