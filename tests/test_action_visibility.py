"""Actions as each persona reads them: in the API, on the pages and in the live feed.

A submitter sees actions touching no job (drains) and those touching its tenants'
jobs; one touching only other tenants' jobs is hidden (404), as those jobs are; in
one touching both, the other tenants' jobs are ids only (no names, hostnames,
reasons). Viewers and operators see everything."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.test import Client

from fleet import events
from fleet.choices import ActionKind
from fleet.models import Action, Node
from fleet.services.actions import propose as action_services
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.sockets import run_socket_test
from tests.support import page_html

SECRETS = ("vision-secret", "host-of-vision", "why-vision")  # what tenant llm must never read
MINE = ("llm-secret", "host-of-llm")


@pytest.fixture
def actions(fleet, submitter, other_submitter, operator):
    """Four proposals: llm's own, vision's own, one touching both, a drain."""
    llm = submit_job(submitter, JobSpec(name="llm-secret", num_gpus=4, tenant="llm"))
    vision = submit_job(other_submitter, JobSpec(name="vision-secret", num_gpus=4, tenant="vision"))
    node = Node.objects.order_by("id").first()

    def allocate(job, host: str, why: str) -> dict:
        return {
            "op": "allocate",
            "job": job.pk,
            "nodes": {str(node.pk): [0]},
            "hostnames": [host],
            "reason": why,
        }

    own = action_services.propose(
        kind=ActionKind.MIGRATION,
        title=f"move job #{llm.pk} llm-secret",
        jobs=[llm.pk],
        steps=[allocate(llm, "host-of-llm", "why-llm"), {"op": "start", "job": llm.pk}],
    )
    foreign = action_services.propose(
        kind=ActionKind.MIGRATION,
        title=f"move job #{vision.pk} vision-secret",
        jobs=[vision.pk],
        steps=[allocate(vision, "host-of-vision", "why-vision")],
    )
    mixed = action_services.propose(
        kind=ActionKind.PREEMPTION,
        title=f"place job #{llm.pk} llm-secret, preempting #{vision.pk} vision-secret",
        jobs=[llm.pk, vision.pk],
        steps=[
            {"op": "preempt", "job": vision.pk},
            allocate(vision, "host-of-vision", "why-vision"),
            allocate(llm, "host-of-llm", "why-llm"),
        ],
        engine_plan={"reason": "vision-secret moves to host-of-vision"},
        benefit={"reason": "why-vision", "free_racks_before": 0, "free_racks_after": 1},
    )
    # What a failed run leaves behind: a log line per step and an error naming a host.
    Action.objects.filter(pk=mixed.pk).update(
        error="step 1 failed on host-of-vision (vision-secret)",
        decision_note="vision-secret must wait",
        log=[
            {
                "at": "2025-01-01T00:00:00",
                "step": 1,
                "op": "allocate",
                "status": "failed",
                "message": "allocate on host-of-vision",
            },
            {
                "at": "2025-01-01T00:00:01",
                "step": 2,
                "op": "allocate",
                "status": "done",
                "message": "allocate on host-of-llm",
            },
        ],
    )
    drain = action_services.propose(
        kind=ActionKind.DRAIN,
        title=f"drain {node.hostname}: xid 79",
        jobs=[],
        steps=[{"op": "drain", "node": node.pk, "hostname": node.hostname}],
    )
    return {
        "own": own.pk,
        "foreign": foreign.pk,
        "mixed": mixed.pk,
        "drain": drain.pk,
        "llm": llm.pk,
        "vision": vision.pk,
    }


def _by_id(client) -> dict[int, dict]:
    body = client.get("/api/actions/", {"state": "proposed"}).json()
    return {a["id"]: a for a in body["results"]}


def test_a_submitter_lists_its_own_actions_and_drains_but_not_another_tenants(actions, submitter_client):
    seen = _by_id(submitter_client)
    assert set(seen) == {actions["own"], actions["mixed"], actions["drain"]}
    assert seen[actions["own"]]["title"].endswith("llm-secret") and seen[actions["own"]]["redacted"] is False
    assert seen[actions["drain"]]["redacted"] is False


def test_a_submitter_reads_other_tenants_jobs_in_a_shared_action_by_id_only(actions, submitter_client):
    mixed = submitter_client.get(f"/api/actions/{actions['mixed']}/").json()
    text = json.dumps(mixed)
    for secret in SECRETS:
        assert secret not in text, secret
    assert "host-of-llm" in text  # its own job's placement stays readable
    assert mixed["redacted"] is True and set(mixed["jobs"]) == {actions["llm"], actions["vision"]}
    assert [s["text"] for s in mixed["steps"]] == [
        f"preempt job #{actions['vision']}",
        f"allocate job #{actions['vision']} on its nodes",
        f"allocate job #{actions['llm']} on host-of-llm",
    ]
    assert mixed["plan"] == {"steps": mixed["plan"]["steps"]}  # the engine plan is withheld
    assert mixed["benefit"] == {"free_racks_before": 0, "free_racks_after": 1}
    assert [line["message"] for line in mixed["log"]] == [
        f"allocate job #{actions['vision']}",
        "allocate on host-of-llm",
    ]


def test_the_other_tenant_reads_the_shared_action_without_llms_details(actions, other_client):
    seen = _by_id(other_client)
    assert set(seen) == {actions["foreign"], actions["mixed"], actions["drain"]}
    text = json.dumps(seen[actions["mixed"]])
    assert "llm-secret" not in text and "host-of-llm" not in text and "vision-secret" not in text
    assert "host-of-vision" in text


def test_a_submitter_gets_404_for_an_action_on_another_tenants_jobs_only(actions, submitter_client):
    assert submitter_client.get(f"/api/actions/{actions['foreign']}/").status_code == 404


def test_the_job_filter_shows_a_submitter_only_actions_it_may_see(actions, submitter_client):
    body = submitter_client.get("/api/actions/", {"job": actions["vision"]}).json()
    assert [a["id"] for a in body["results"]] == [actions["mixed"]]
    assert "vision-secret" not in json.dumps(body)


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_read_every_action_in_full(actions, request, persona):
    client = request.getfixturevalue(persona)
    seen = _by_id(client)
    assert set(seen) == {actions[k] for k in ("own", "foreign", "mixed", "drain")}
    mixed = seen[actions["mixed"]]
    assert mixed["redacted"] is False and "vision-secret" in mixed["title"]
    assert mixed["error"].startswith("step 1 failed on host-of-vision")


def test_the_actions_page_withholds_other_tenants_jobs_from_a_submitter(actions, submitter, viewer):
    html = page_html(submitter, "/actions/?state=all")
    for secret in SECRETS:
        assert secret not in html, secret
    assert f'data-action-id="{actions["foreign"]}"' not in html
    assert f'data-action-id="{actions["mixed"]}"' in html and "llm-secret" in html
    assert "vision-secret" in page_html(viewer, "/actions/?state=all")


def test_a_job_page_lists_its_actions_with_other_tenants_withheld(actions, submitter):
    html = page_html(submitter, f"/jobs/{actions['llm']}/")
    assert f"#{actions['mixed']}" in html
    for secret in SECRETS:
        assert secret not in html, secret


# -- the live feed --------------------------------------------------------------------------


def _headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [
        (b"origin", b"http://localhost"),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]


def _action_events(user, ids: list[int]) -> dict[int, dict]:
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from rackwise.asgi import application

    headers = _headers(user)

    async def run() -> dict[int, dict]:
        communicator = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await communicator.receive_json_from(timeout=5)  # hello
        await database_sync_to_async(events.actions_changed)(ids)  # outside a transaction: sent now
        got: dict[int, dict] = {}
        while len(got) < len(ids):
            event = await communicator.receive_json_from(timeout=5)
            if event["type"] == "action":
                got[event["action"]["id"]] = event["action"]
        await communicator.disconnect()
        return got

    return run_socket_test(run)


@pytest.mark.django_db(transaction=True)
def test_action_events_reach_a_submitter_redacted_as_the_api_does(actions, submitter, viewer):
    ids = [actions["own"], actions["foreign"], actions["mixed"]]
    mine = _action_events(submitter, ids)
    assert mine[actions["own"]]["title"].endswith("llm-secret")
    assert mine[actions["foreign"]]["title"] is None and mine[actions["foreign"]]["state"] == "proposed"
    text = json.dumps(mine)
    for secret in SECRETS:
        assert secret not in text, secret
    assert "llm-secret" not in mine[actions["mixed"]]["title"]  # the shared title is withheld whole
    full = _action_events(viewer, ids)
    assert (
        "vision-secret" in full[actions["mixed"]]["title"]
        and "vision-secret" in full[actions["foreign"]]["title"]
    )
