"""The live feed's Origin check compares scheme, host and port with the
connection's own origin, or with CSRF_TRUSTED_ORIGINS (not just the host name)."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from rackwise.asgi import application
from tests.sockets import run_socket_test

pytestmark = pytest.mark.django_db(transaction=True)


def _headers(user, origin: str, host: str = "localhost") -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [
        (b"origin", origin.encode()),
        (b"host", host.encode()),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]


def _connects(headers) -> bool:
    async def run() -> bool:
        communicator = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected

    return run_socket_test(run)


@pytest.mark.parametrize(
    ("origin", "host", "accepted"),
    [
        ("http://localhost", "localhost", True),
        ("http://localhost:8000", "localhost:8000", True),
        ("http://localhost:9999", "localhost:8000", False),
        ("http://localhost:9999", "localhost", False),
        ("https://localhost", "localhost", False),
        ("http://evil.example", "localhost", False),
        ("null", "localhost", False),
    ],
)
def test_it_accepts_only_the_connections_own_origin(fleet, viewer, origin, host, accepted):
    assert _connects(_headers(viewer, origin, host)) is accepted


def test_it_accepts_an_origin_listed_in_csrf_trusted_origins(fleet, viewer, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com"]

    assert _connects(_headers(viewer, "https://console.example.com", "localhost")) is True
    assert _connects(_headers(viewer, "https://console.example.com:8443", "localhost")) is False


def test_it_refuses_a_handshake_without_an_origin(fleet, viewer):
    headers = [h for h in _headers(viewer, "http://localhost") if h[0] != b"origin"]

    assert _connects(headers) is False
