"""The live feed stays up on a quiet fleet (issue #10, item 1).

channels_redis blocks in BZPOPMIN for 5 s per wait; with redis-py's 5 s default
read timeout the channel layer's read timed out and the socket closed with 1011
about every 5.5 s whenever nothing happened. Through the real ASGI app and the
real Redis channel layer: a socket left idle for 30 s still answers a ping and
still gets a rack event."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from fleet.models import Node
from fleet.services.nodes import moves as node_services
from rackwise.asgi import application
from tests.sockets import run_socket_test

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_S = 30


def _headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [
        (b"origin", b"http://localhost"),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]


def test_the_channel_layer_read_timeout_outlasts_its_blocking_pop():
    layer = get_channel_layer()
    timeout = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["socket_timeout"]
    assert type(layer).__name__ == "RedisChannelLayer"
    assert timeout > layer.brpop_timeout


def test_an_idle_socket_still_answers_a_ping_and_gets_rack_events_after_30_s(fleet, viewer, operator):
    rack = fleet[0]
    node = Node.objects.filter(rack=rack).order_by("slot").first()
    headers = _headers(viewer)

    async def run():
        communicator = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        assert (await communicator.receive_json_from(timeout=5))["type"] == "hello"
        # Nothing happens on the fleet for 30 s: the consumer sits in the channel
        # layer's blocking receive the whole time.
        await asyncio.sleep(IDLE_S)
        assert await communicator.receive_nothing(timeout=0.1)
        await communicator.send_json_to({"type": "ping"})
        assert await communicator.receive_json_from(timeout=5) == {"type": "pong"}
        await database_sync_to_async(node_services.drain_node)(operator, node.pk, "maintenance")
        while True:
            event = await communicator.receive_json_from(timeout=10)
            if event["type"] == "rack":
                break
        await communicator.disconnect()
        return event

    event = run_socket_test(run)
    assert event["rack"] == rack.pk
    states = {n[0]: n[3] for n in event["nodes"]}
    assert states[node.pk] == "drained"
