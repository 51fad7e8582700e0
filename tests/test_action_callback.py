"""The webhook executor's callback, ``POST /api/actions/<id>/callback/``: the
signature is checked before anything about the action is said, and a signed
callback is bound to one action and one step, so it cannot be replayed to
another."""

from __future__ import annotations

import json

import pytest

from fleet import signing
from fleet.choices import ActionKind, ActionState
from fleet.models import Action
from fleet.services.actions.propose import propose

SECRET = "executor-secret"


@pytest.fixture(autouse=True)
def executor_secret(settings):
    settings.RACKWISE_WEBHOOK_SECRET = SECRET


def _action(fleet, state: str = ActionState.EXECUTING, steps: int = 1) -> Action:
    node = fleet[0].nodes.first()
    action = propose(
        kind=ActionKind.DRAIN, title="drain", steps=[{"op": "drain", "node": node.pk}] * steps, jobs=[]
    )
    Action.objects.filter(pk=action.pk).update(state=state)
    return action


def _post(client, action_id: int, body: bytes, secret: str | None = SECRET):
    headers = {signing.HEADER: signing.sign(secret, body)} if secret else {}
    return client.post(
        f"/api/actions/{action_id}/callback/", body, content_type="application/json", headers=headers
    )


def _body(action_id: int, step: int = 0, status: str = "succeeded") -> bytes:
    return json.dumps({"action_id": action_id, "step_index": step, "status": status}).encode()


@pytest.mark.parametrize("secret", [None, "wrong"], ids=["unsigned", "badly signed"])
def test_it_refuses_an_unsigned_callback_to_an_action_that_is_not_executing_with_403_not_409(
    fleet, client, secret
):
    proposed = _action(fleet, state=ActionState.PROPOSED)

    response = _post(client, proposed.pk, _body(proposed.pk), secret)

    assert response.status_code == 403
    assert "not executing" not in response.content.decode()


def test_it_refuses_an_unsigned_callback_to_an_unknown_action_with_403_not_404(fleet, client):
    assert _post(client, 999_999, _body(999_999), secret=None).status_code == 403


def test_it_answers_409_to_a_signed_callback_for_an_action_that_is_not_executing(fleet, client):
    proposed = _action(fleet, state=ActionState.PROPOSED)

    response = _post(client, proposed.pk, _body(proposed.pk))

    assert response.status_code == 409
    assert "not executing" in response.json()["detail"]


def test_it_refuses_a_valid_callback_for_one_action_replayed_to_another(fleet, client):
    a, b = _action(fleet), _action(fleet)
    body = _body(a.pk)

    assert _post(client, a.pk, body).status_code == 202
    replayed = _post(client, b.pk, body)

    assert replayed.status_code == 403
    assert f"signed for action #{a.pk}" in replayed.json()["detail"]
    b.refresh_from_db()
    assert b.callbacks == {}


def test_it_refuses_a_callback_for_a_step_the_action_is_not_executing(fleet, client):
    action = _action(fleet, steps=3)

    response = _post(client, action.pk, _body(action.pk, step=1))

    assert response.status_code == 409
    assert "executing step 0, not step 1" in response.json()["detail"]
    action.refresh_from_db()
    assert action.callbacks == {}


def test_it_refuses_a_callback_without_the_action_id_it_is_for(fleet, client):
    action = _action(fleet)
    body = json.dumps({"step_index": 0, "status": "succeeded"}).encode()

    response = _post(client, action.pk, body)

    assert response.status_code == 400
    assert "action_id" in response.json()["detail"]


def test_a_step_result_is_recorded_once_and_a_retried_callback_is_accepted(fleet, client):
    action = _action(fleet)

    assert _post(client, action.pk, _body(action.pk)).status_code == 202
    assert _post(client, action.pk, _body(action.pk)).status_code == 202
    contradicting = _post(client, action.pk, _body(action.pk, status="failed"))

    assert contradicting.status_code == 409
    action.refresh_from_db()
    assert action.callbacks == {"0": {"status": "succeeded", "message": ""}}
