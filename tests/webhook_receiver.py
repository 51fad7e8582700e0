"""A real HTTP receiver for webhook tests, and helpers to subscribe it and to
deliver in this process what the webhooks worker would."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleet import signing
from fleet.choices import DeliveryState
from fleet.models import WebhookDelivery, WebhookEndpoint
from fleet.services import webhooks as webhook_services

# Webhook targets on loopback are refused unless allowed; tests allow this one
# network explicitly (in-process settings, and the environment of subprocesses).
LOOPBACK_NET = "127.0.0.1/32"
ALLOW_LOOPBACK_ENV = {"RACKWISE_WEBHOOK_ALLOW_NETS": LOOPBACK_NET}


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
                        "host": self.headers.get("Host"),
                        "event": self.headers.get("X-Rackwise-Event"),
                        "delivery": self.headers.get("X-Rackwise-Delivery"),
                        "valid": signing.verify(receiver.secret, body, self.headers.get(signing.HEADER)),
                        "body": json.loads(body),
                    }
                )
                if receiver.delay:
                    receiver.release.wait(receiver.delay)
                self.send_response(receiver.status)
                if 300 <= receiver.status < 400:
                    self.send_header("Location", receiver.url)
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


def subscribe(operator, receiver: Receiver, *events: str) -> WebhookEndpoint:
    endpoint = webhook_services.create_endpoint(operator, url=receiver.url, event_types=list(events))
    receiver.secret = endpoint.secret
    return endpoint


def deliver_all() -> list[str]:
    """What the webhooks worker does, in this process: attempt every open delivery."""
    ids = (
        WebhookDelivery.objects.filter(state__in=[DeliveryState.PENDING])
        .order_by("id")
        .values_list("pk", flat=True)
    )
    return [webhook_services.attempt_delivery(pk).message for pk in ids]
