"""The console's websocket feed, through the real ASGI app, session auth and the
Redis channel layer."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from fleet.models import Node
from fleet.services import nodes as node_services
from fleet.services.jobs import JobSpec, apply_placement, submit_job
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
