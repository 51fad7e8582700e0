"""The console's websocket feed, through the real ASGI app, session auth and the
Redis channel layer."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client

from fleet.models import Node
from fleet.services.jobs.allocations import apply_placement
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes import moves as node_services
from rackwise.asgi import application
from tests.sockets import run_socket_test

pytestmark = pytest.mark.django_db(transaction=True)


def _headers(user) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://localhost")]
    if user is not None:
        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    return headers


async def _connect(headers):
    communicator = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


async def _next_of(communicator, kind: str, timeout: float = 5) -> dict:
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        if event["type"] == kind:
            return event


def test_an_anonymous_socket_is_refused():
    headers = _headers(None)

    async def run():
        _, connected, code = await _connect(headers)
        assert (connected, code) == (False, 4401)

    run_socket_test(run)


def test_a_user_without_a_role_is_refused(outsider):
    headers = _headers(outsider)

    async def run():
        _, connected, code = await _connect(headers)
        assert (connected, code) == (False, 4403)

    run_socket_test(run)


def test_rack_events_arrive_in_version_order_with_the_new_cell_state(fleet, viewer, operator):
    rack = fleet[0]
    nodes = list(Node.objects.filter(rack=rack).order_by("slot")[:3])

    headers = _headers(viewer)

    async def run():
        communicator, connected, _ = await _connect(headers)
        assert connected
        hello = await communicator.receive_json_from(timeout=5)
        assert hello == {"type": "hello", "user": viewer.username, "role": "viewer"}
        start = rack.version
        for node in nodes:
            await database_sync_to_async(node_services.drain_node)(operator, node.pk, "maintenance")
        seen = [await _next_of(communicator, "rack") for _ in nodes]
        await communicator.disconnect()
        return start, seen

    start, seen = run_socket_test(run)
    assert [e["version"] for e in seen] == [start + 1, start + 2, start + 3]
    last = seen[-1]
    assert last["rack"] == rack.pk and len(last["nodes"]) == 18
    states = {n[0]: n[3] for n in last["nodes"]}
    assert [states[n.pk] for n in nodes] == ["drained"] * 3
    assert all(len(n[4]) == 4 for n in last["nodes"])


def test_a_submitter_sees_other_tenants_jobs_on_the_grid_only_as_ids(fleet, submitter, other_submitter):
    node = Node.objects.filter(rack=fleet[0]).order_by("slot").first()

    headers = _headers(other_submitter)

    async def run():
        communicator, connected, _ = await _connect(headers)
        assert connected
        await communicator.receive_json_from(timeout=5)

        def place():
            job = submit_job(submitter, JobSpec(name="secret-llm", num_gpus=4, tenant="llm"))
            apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")
            return job

        job = await database_sync_to_async(place)()
        events = []
        while not any(e["type"] == "rack" for e in events) or sum(e["type"] == "job" for e in events) < 2:
            events.append(await communicator.receive_json_from(timeout=5))
        await communicator.disconnect()
        event = next(e for e in events if e["type"] == "rack")
        job_event = [e for e in events if e["type"] == "job"][-1]
        return job, event, job_event

    job, event, job_event = run_socket_test(run)
    assert job_event["job"]["state"] == "placed"
    cells = {n[0]: n[4] for n in event["nodes"]}
    assert cells[node.pk] == [["ok", job.pk]] * 4
    assert event["jobs"][str(job.pk)]["name"] is None and event["jobs"][str(job.pk)]["tenant"] is None
    assert job_event["job"]["id"] == job.pk and job_event["job"]["name"] is None
    assert "secret-llm" not in str(event) + str(job_event)


def _logged_in(user) -> tuple[Client, list[tuple[bytes, bytes]]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return client, [
        (b"origin", b"http://localhost"),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]


async def _closed_with(communicator, timeout: float = 5) -> int:
    while True:
        output = await communicator.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output["code"]


def test_logging_out_closes_the_sessions_open_socket_and_no_other(viewer):
    """An open socket kept streaming after logout (#28 item 16)."""
    client, headers = _logged_in(viewer)
    _, other_headers = _logged_in(viewer)  # the same user in another browser

    async def run():
        mine, connected, _ = await _connect(headers)
        theirs, connected_too, _ = await _connect(other_headers)
        assert connected and connected_too
        await mine.receive_json_from(timeout=5)
        await theirs.receive_json_from(timeout=5)
        await database_sync_to_async(client.logout)()
        code = await _closed_with(mine)
        assert await theirs.receive_nothing(timeout=0.5)
        await theirs.disconnect()
        return code

    assert run_socket_test(run) == 4401


def test_losing_the_role_closes_the_socket_and_a_new_role_carries_on(viewer):
    from django.contrib.auth.models import Group

    _, headers = _logged_in(viewer)

    async def run():
        communicator, connected, _ = await _connect(headers)
        assert connected
        await communicator.receive_json_from(timeout=5)

        def promote():
            with transaction.atomic():  # as ensure_user and the admin change a role
                viewer.groups.clear()
                viewer.groups.add(Group.objects.get_or_create(name="operator")[0])

        await database_sync_to_async(promote)()
        hello = await _next_of(communicator, "hello")
        assert hello["role"] == "operator"
        await database_sync_to_async(viewer.groups.clear)()
        return await _closed_with(communicator)

    assert run_socket_test(run) == 4403


def test_a_ping_renews_the_sockets_group_membership_so_stale_members_expire(viewer):
    """A socket gone without a disconnect stayed a member of the feed's group for
    24 h (#28 item 16): members now expire after 5 minutes unless a ping renews them."""
    import redis as redis_client

    from fleet.events import GROUP

    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["group_expiry"] == 300
    _, headers = _logged_in(viewer)
    r = redis_client.Redis.from_url(settings.REDIS_URL)
    key = f"asgi:group:{GROUP}"

    async def run():
        communicator, connected, _ = await _connect(headers)
        assert connected
        await communicator.receive_json_from(timeout=5)
        joined = dict(await database_sync_to_async(r.zrange)(key, 0, -1, withscores=True))
        await asyncio.sleep(1.1)
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from(timeout=5))["type"] == "pong"
        renewed = dict(await database_sync_to_async(r.zrange)(key, 0, -1, withscores=True))
        await communicator.disconnect()
        return joined, renewed

    joined, renewed = run_socket_test(run)
    assert any(renewed[m] > joined[m] + 1 for m in joined.keys() & renewed.keys())
