"""Signed step callbacks from the webhook cluster's receiver
(``POST /api/actions/<id>/callback/``, see :mod:`fleet.cluster.webhook`)."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import transaction

from fleet import dispatch, signing
from fleet.choices import ActionState
from fleet.models import Action
from fleet.services.errors import Conflict

MAX_EXTERNAL_ID_CHARS = 64  # Job.external_id


def record_callback(action_id: int, body: bytes, signature: str | None) -> dict:
    """A signed callback from the webhook receiver: remember the step's result and
    let a worker carry on.

    1. The signature is checked before anything else, so an unsigned caller
       learns nothing about actions (not even whether one exists or executes).
    2. The signed body names the action and the step (``action_id``,
       ``step_index``, echoed from the step's POST): a callback for one action
       cannot be replayed to another, nor to another step of the same action.
    3. Only then the action's state: it must be executing that very step, and a
       step's result is recorded once (the same result again is accepted as is).

    An optional ``external_id`` (string) is the job's id in the receiver's
    cluster; it is stored on the job with the step's database change.

    Raises PermissionError for a bad signature or a callback signed for another
    action, ValueError for a malformed body, ``Conflict`` when the action is not
    executing that step, and ``Action.DoesNotExist`` for an unknown action."""
    if not signing.verify(settings.RACKWISE_WEBHOOK_SECRET, body, signature):
        raise PermissionError("bad or missing signature")
    try:
        data = json.loads(body)
        signed_action, index, status = data["action_id"], data["step_index"], data["status"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            "body must be a JSON object with action_id (int), step_index (int) and status (succeeded|failed)"
        ) from exc
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (signed_action, index)):
        raise ValueError("action_id and step_index must be integers")
    if status not in ("succeeded", "failed"):
        raise ValueError("status must be succeeded or failed")
    external_id = data.get("external_id")
    if external_id is not None and not (
        isinstance(external_id, str) and 0 < len(external_id) <= MAX_EXTERNAL_ID_CHARS
    ):
        raise ValueError(f"external_id must be a string of 1 to {MAX_EXTERNAL_ID_CHARS} characters")
    if signed_action != action_id:
        raise PermissionError(f"this callback is signed for action #{signed_action}, not #{action_id}")

    result = {"status": status, "message": str(data.get("message", ""))[:500]}
    if external_id is not None:
        result["external_id"] = external_id
    with transaction.atomic():
        action = Action.objects.select_for_update().get(pk=action_id)
        if action.state != ActionState.EXECUTING:
            raise Conflict(f"action #{action_id} is not executing")
        if index != action.step_index:
            raise Conflict(f"action #{action_id} is executing step {action.step_index}, not step {index}")
        callbacks = dict(action.callbacks or {})
        if str(index) in callbacks:
            if callbacks[str(index)] == result:
                return result  # a retried callback: already recorded
            raise Conflict(
                f"step {index} of action #{action_id} was already reported {callbacks[str(index)]['status']}"
            )
        callbacks[str(index)] = result
        action.callbacks = callbacks
        action.save(update_fields=["callbacks", "updated_at"])
        dispatch.execute_soon(action.pk)
    return result
