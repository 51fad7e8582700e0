"""The actions API: who may decide, the approval policy, defrag requests, and
the webhook cluster's signed callbacks."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from fleet import signing
from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, ApprovalPolicy, AuditEvent, Job
from fleet.services.actions.propose import propose
from tests.support import nodes_of, wait_for, workers


@pytest.fixture
def proposed(fleet):
    return propose(
        kind=ActionKind.DRAIN,
        title="drain r1-n00",
        steps=[{"op": "drain", "node": fleet[0].nodes.first().pk}],
        jobs=[],
    )


@pytest.mark.parametrize("verb", ["approve", "reject", "cancel"])
def test_only_operators_may_decide_on_an_action(
    proposed, verb, anon_client, viewer_client, submitter_client, outsider_client
):
    for client, code in (
        (anon_client, 401),
        (outsider_client, 403),
        (viewer_client, 403),
        (submitter_client, 403),
    ):
        response = client.post(f"/api/actions/{proposed.pk}/{verb}/", {}, format="json")
        assert response.status_code == code
    proposed.refresh_from_db()
    assert proposed.state == ActionState.PROPOSED
    assert not AuditEvent.objects.filter(action=f"action.{verb}").exists()


def test_everyone_with_a_role_reads_the_queue(proposed, viewer_client, submitter_client):
    for client in (viewer_client, submitter_client):
        response = client.get("/api/actions/?state=proposed")
        assert response.status_code == 200
        assert [a["id"] for a in response.json()["results"]] == [proposed.pk]
        assert response.json()["results"][0]["steps"][0]["text"].startswith("drain node")


def test_an_operator_rejects_with_a_note_and_the_decision_is_audited(proposed, operator_client, operator):
    response = operator_client.post(
        f"/api/actions/{proposed.pk}/reject/", {"note": "maintenance window"}, format="json"
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["state"], body["decided_by_name"], body["decision_note"]) == (
        "rejected",
        operator.username,
        "maintenance window",
    )
    event = AuditEvent.objects.get(action="action.reject")
    assert event.actor == operator and event.before == {"state": "proposed"}


def test_deciding_twice_is_a_conflict(proposed, operator_client):
    assert operator_client.post(f"/api/actions/{proposed.pk}/cancel/", {}, format="json").status_code == 200
    for verb in ("approve", "reject", "cancel"):
        response = operator_client.post(f"/api/actions/{proposed.pk}/{verb}/", {}, format="json")
        assert response.status_code == 409
        assert "cancelled" in response.json()["detail"]


def test_the_approval_policy_has_safe_defaults_and_operators_change_it(db, operator_client, viewer_client):
    policy = viewer_client.get("/api/approval-policy/").json()
    assert policy["placement"] == "auto" and policy["recovery"] == "auto"
    for kind in ("placement_spill", "preemption", "migration", "defrag"):
        assert policy[kind] == "manual", kind
    assert (
        viewer_client.put(
            "/api/approval-policy/", {"kind": "defrag", "mode": "auto"}, format="json"
        ).status_code
        == 403
    )
    response = operator_client.put("/api/approval-policy/", {"kind": "defrag", "mode": "auto"}, format="json")
    assert response.status_code == 200 and response.json()["defrag"] == "auto"
    assert ApprovalPolicy.mode_for("defrag") == "auto"
    bad = operator_client.put("/api/approval-policy/", {"kind": "defrag", "mode": "sometimes"}, format="json")
    assert bad.status_code == 400 and "mode" in bad.json()


def test_a_defrag_request_with_a_bad_target_is_refused(fleet, operator_client):
    for body, field in (
        ({"free_racks": 0}, "free_racks"),
        ({"budget_gpu_hours": -1}, "budget_gpu_hours"),
        ({"max_moves": "x"}, "max_moves"),
    ):
        response = operator_client.post("/api/actions/defrag/", body, format="json")
        assert response.status_code == 400 and field in response.json(), response.content
    both = operator_client.post("/api/actions/defrag/", {"free_racks": 1, "room_for_nodes": 4}, format="json")
    assert both.status_code == 400 and "not both" in str(both.json())
    assert not Action.objects.exists()


def test_a_defrag_request_on_a_tidy_fleet_proposes_nothing_and_says_why(fleet, operator_client):
    response = operator_client.post("/api/actions/defrag/", {}, format="json")
    assert response.status_code == 200
    assert response.json()["proposed"] is False and "nothing to do" in response.json()["reason"]


def test_the_fragmentation_endpoint_reports_every_rack(fleet, viewer_client):
    body = viewer_client.get("/api/fleet/fragmentation/").json()
    assert [r["rack"] for r in body["racks"]] == ["r1", "r2"]
    # 16-node slices: each rack keeps 2 of its 18 nodes spare.
    assert body["free_gpus"] == 144 and body["largest_job_gpus"] == 64 and body["fraction"] == 0


class _Receiver(BaseHTTPRequestHandler):
    """A cluster-side webhook receiver: checks the signature, then reports each
    step done with a signed callback."""

    secret = ""
    callback_base = ""
    received: list[dict] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ok = signing.verify(self.secret, body, self.headers.get(signing.HEADER))
        self.send_response(202 if ok else 401)
        self.end_headers()
        if not ok:
            return
        delivery = json.loads(body)
        type(self).received.append(delivery)
        reply = json.dumps(
            {"action_id": delivery["action_id"], "step_index": delivery["step_index"], "status": "succeeded"}
        ).encode()
        import urllib.request

        request = urllib.request.Request(
            self.callback_base + delivery["callback_url"],
            data=reply,
            method="POST",
            headers={"Content-Type": "application/json", signing.HEADER: signing.sign(self.secret, reply)},
        )
        threading.Thread(
            target=lambda: urllib.request.urlopen(request, timeout=10).read(), daemon=True
        ).start()

    def log_message(self, *args):
        pass


@pytest.mark.django_db(transaction=True)
def test_the_webhook_cluster_posts_signed_steps_and_waits_for_signed_callbacks(
    live_server, fleet, submitter_client, settings
):
    secret = "s3cret-for-tests"
    settings.RACKWISE_WEBHOOK_SECRET = secret
    _Receiver.secret, _Receiver.callback_base, _Receiver.received = secret, live_server.url, []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "RACKWISE_CLUSTER": "webhook",
        "RACKWISE_WEBHOOK_URL": f"http://127.0.0.1:{server.server_port}/steps",
        "RACKWISE_WEBHOOK_SECRET": secret,
    }
    try:
        with workers(1, env=env):
            job_id = submitter_client.post(
                "/api/jobs/",
                {"name": "w", "num_nodes": 2, "gpus_per_node": 4, "tenant": "llm"},
                format="json",
            ).json()["id"]
            wait_for(
                lambda: Job.objects.filter(pk=job_id, state=JobState.RUNNING).exists(), 30, "the job to start"
            )
    finally:
        server.shutdown()
    assert [d["step"]["op"] for d in _Receiver.received] == ["start"]
    assert len(nodes_of(job_id)) == 2
    action = Action.objects.get(jobs=job_id)
    assert action.callbacks == {"1": {"status": "succeeded", "message": ""}}


def test_a_callback_with_a_bad_signature_is_refused(fleet, client, settings):
    settings.RACKWISE_WEBHOOK_SECRET = "right"
    action = propose(
        kind=ActionKind.DRAIN, title="x", steps=[{"op": "drain", "node": fleet[0].nodes.first().pk}], jobs=[]
    )
    Action.objects.filter(pk=action.pk).update(state=ActionState.EXECUTING)
    body = json.dumps({"action_id": action.pk, "step_index": 0, "status": "succeeded"}).encode()
    forged = client.post(
        f"/api/actions/{action.pk}/callback/",
        body,
        content_type="application/json",
        headers={signing.HEADER: signing.sign("wrong", body)},
    )
    assert forged.status_code == 403
    good = client.post(
        f"/api/actions/{action.pk}/callback/",
        body,
        content_type="application/json",
        headers={signing.HEADER: signing.sign("right", body)},
    )
    assert good.status_code == 202
    action.refresh_from_db()
    assert action.callbacks == {"0": {"status": "succeeded", "message": ""}}
