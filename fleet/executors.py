"""Executors carry out a step of an action in the cluster (checkpoint a job,
stop it, start it on nodes). The database side of each step is applied by
``fleet.services.actions`` once the executor reports the step done.

* ``simulated`` (default): realistic delays with progress reports, optional
  injected failures, and simulated jobs that complete after their expected
  duration.
* ``webhook``: each step is POSTed, HMAC-signed, to a URL; the receiver answers
  later with a signed callback to ``/api/actions/<id>/callback/`` whose body
  echoes the step's ``action_id`` and ``step_index`` (signed with the body, so a
  callback cannot be replayed to another action or step). A step with no
  callback within the timeout fails. ``RACKWISE_WEBHOOK_URL`` is operator
  configuration (the environment), not user input, so it is not held to the
  address rules of event webhooks (``fleet.services.webhook_targets``): an
  executor inside the cluster network is the normal case.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Protocol

from django.conf import settings
from django.utils import timezone

from fleet import events, signing
from fleet.choices import ActionState
from fleet.models import Action, Job
from fleet.services.actions import StepFailed
from fleet.services.dispatch import after_commit
from fleet.services.errors import Conflict

log = logging.getLogger(__name__)

DONE = "done"
WAITING = "waiting"

# Relative duration of each op (times RACKWISE_SIM_STEP_SECONDS).
SIM_DURATIONS = {
    "checkpoint": 2.0,
    "stop": 1.0,
    "preempt": 1.5,
    "requeue": 0.5,
    "swap": 0.5,
    "allocate": 0.0,
    "start": 1.0,
    "restart": 1.5,
    "drain": 0.2,
}


class Executor(Protocol):
    def perform(self, action: Action, index: int, step: dict) -> str:
        """Do the step in the cluster: DONE, or WAITING for a callback; raise
        StepFailed when it cannot be done."""

    def after_step(self, action: Action, index: int, step: dict) -> None:
        """Called once the step's database change has committed."""


class SimulatedExecutor:
    def __init__(self, step_seconds: float, failure_rate: float, time_scale: float, seed: int | None = None) -> None:
        self.step_seconds = step_seconds
        self.failure_rate = failure_rate
        self.time_scale = time_scale
        self.rng = random.Random(seed)

    def perform(self, action: Action, index: int, step: dict) -> str:
        duration = SIM_DURATIONS.get(step["op"], 0.5) * self.step_seconds
        total = max(1, len(action.steps))
        deadline = time.monotonic() + duration
        # Report progress within the step a few times a second, for the console.
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.25, left))
            done = 1 - max(0.0, deadline - time.monotonic()) / duration
            Action.objects.filter(pk=action.pk, step_index=index).update(
                progress=(index + done) / total, step_started_at=timezone.now()
            )
            events.actions_changed([action.pk])
        if self.failure_rate and self.rng.random() < self.failure_rate:
            raise StepFailed(f"simulated failure injected in {step['op']}")
        return DONE

    def after_step(self, action: Action, index: int, step: dict) -> None:
        if step["op"] not in ("start", "restart"):
            return
        job = Job.objects.filter(pk=step["job"]).values("expected_duration_s", "attempt").first()
        if job and job["expected_duration_s"]:
            # A simulated job completes after its expected duration (scaled); a
            # restart makes this run's attempt the only one that counts.
            from fleet.tasks import simulated_job_end

            simulated_job_end.apply_async(
                (step["job"], job["attempt"]), countdown=job["expected_duration_s"] * self.time_scale
            )


class WebhookExecutor:
    def __init__(self, url: str, secret: str, timeout_s: float) -> None:
        self.url = url
        self.secret = secret
        self.timeout_s = timeout_s

    def perform(self, action: Action, index: int, step: dict) -> str:
        result = (action.callbacks or {}).get(str(index))
        if result is not None:
            if result.get("status") == "succeeded":
                return DONE
            raise StepFailed(result.get("message") or "the executor reported a failure")
        if action.step_started_at is not None:
            waited = (timezone.now() - action.step_started_at).total_seconds()
            if waited > self.timeout_s:
                raise StepFailed(f"no callback within {self.timeout_s:.0f} s")
            return WAITING
        body = json.dumps(
            {
                "action_id": action.pk,
                "kind": action.kind,
                "step_index": index,
                "step": step,
                "callback_url": f"/api/actions/{action.pk}/callback/",
            },
            sort_keys=True,
        ).encode()
        try:
            answer = signing.post_signed(self.url, self.secret, body, timeout=10)
        except OSError as exc:
            raise StepFailed(f"webhook {self.url} unreachable: {exc}") from exc
        if not 200 <= answer.status < 300:
            raise StepFailed(f"webhook answered HTTP {answer.status}")
        Action.objects.filter(pk=action.pk, step_index=index).update(step_started_at=timezone.now())
        return WAITING

    def after_step(self, action: Action, index: int, step: dict) -> None:
        return None


def get_executor() -> Executor:
    if settings.RACKWISE_EXECUTOR == "webhook":
        return WebhookExecutor(
            settings.RACKWISE_WEBHOOK_URL, settings.RACKWISE_WEBHOOK_SECRET, settings.RACKWISE_WEBHOOK_TIMEOUT_S
        )
    return SimulatedExecutor(
        settings.RACKWISE_SIM_STEP_SECONDS, settings.RACKWISE_SIM_FAILURE_RATE, settings.RACKWISE_SIM_TIME_SCALE
    )


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
    if signed_action != action_id:
        raise PermissionError(f"this callback is signed for action #{signed_action}, not #{action_id}")
    from django.db import transaction

    result = {"status": status, "message": str(data.get("message", ""))[:500]}
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
            raise Conflict(f"step {index} of action #{action_id} was already reported {callbacks[str(index)]['status']}")
        callbacks[str(index)] = result
        action.callbacks = callbacks
        action.save(update_fields=["callbacks", "updated_at"])
        after_commit("fleet.tasks.execute_action", action.pk)
    return result
