"""The webhook cluster (``RACKWISE_CLUSTER=webhook``): each step is POSTed,
HMAC-signed, to ``RACKWISE_WEBHOOK_URL``; the receiver answers later with a
signed callback to ``/api/actions/<id>/callback/`` whose body echoes the step's
``action_id`` and ``step_index`` (signed with the body, so a callback cannot be
replayed to another action or step), and may name the job's id in its cluster
(``external_id``). The callback is recorded by
:func:`fleet.services.execution.callbacks.record_callback`; this adapter reads it on the
next call. A step with no callback within ``RACKWISE_WEBHOOK_TIMEOUT_S`` fails.

A receiver that cannot be reached, or answers 5xx, is :class:`ClusterUnavailable`
(the step is retried with backoff); any other non-2xx answer fails the step.

``RACKWISE_WEBHOOK_URL`` is operator configuration (the environment), not user
input, so it is not held to the address rules of event webhooks
(``fleet.services.webhook_targets``): a receiver inside the cluster network is
the normal case.

Node changes, job cancels and state reports are not part of the webhook
protocol: ``set_node_state`` and ``cancel`` do nothing, ``node_states`` reports
nothing (heartbeats are the source) and ``job_states`` knows no job, so jobs
end in Rackwise only when someone finishes or cancels them there. Nor are
logs: ``read_log`` says that this cluster keeps none Rackwise can read.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.utils import timezone

from fleet import signing
from fleet.cluster.base import (
    DONE,
    WAITING,
    ClusterUnavailable,
    JobReport,
    LogChunk,
    NodeReport,
    Outcome,
    Progress,
    StepFailed,
)
from fleet.models import Action, Job
from fleet.steps import Step


class WebhookAdapter:
    name = "webhook"

    def __init__(self, url: str, secret: str, timeout_s: float) -> None:
        self.url = url
        self.secret = secret
        self.timeout_s = timeout_s

    @classmethod
    def from_settings(cls) -> WebhookAdapter:
        return cls(
            settings.RACKWISE_WEBHOOK_URL,
            settings.RACKWISE_WEBHOOK_SECRET,
            settings.RACKWISE_WEBHOOK_TIMEOUT_S,
        )

    def perform(self, action: Action, index: int, step: Step, report: Progress | None = None) -> Outcome:
        result = (action.callbacks or {}).get(str(index))
        if result is not None:
            if result.get("status") == "succeeded":
                return Outcome(DONE, external_id=result.get("external_id") or None)
            raise StepFailed(result.get("message") or "the webhook receiver reported a failure")
        if action.step_started_at is not None:
            waited = (timezone.now() - action.step_started_at).total_seconds()
            if waited > self.timeout_s:
                raise StepFailed(f"no callback within {self.timeout_s:.0f} s")
            return Outcome(WAITING)
        body = json.dumps(
            {
                "action_id": action.pk,
                "kind": action.kind,
                "step_index": index,
                "step": step.to_dict(),
                "callback_url": f"/api/actions/{action.pk}/callback/",
            },
            sort_keys=True,
        ).encode()
        try:
            answer = signing.post_signed(self.url, self.secret, body, timeout=10)
        except OSError as exc:
            raise ClusterUnavailable(f"webhook {self.url} unreachable: {exc}") from exc
        if answer.status >= 500:
            raise ClusterUnavailable(f"webhook answered HTTP {answer.status}")
        if not 200 <= answer.status < 300:
            raise StepFailed(f"webhook answered HTTP {answer.status}")
        if report is not None:
            report(0.0)  # the step has begun: its callback is due within the timeout
        return Outcome(WAITING)

    def reports_fleet(self) -> bool:
        return False  # the webhook protocol carries steps only

    def after_step(self, action: Action, index: int, step: Step) -> None:
        return None

    def cancel(self, job: Job) -> None:
        return None  # not part of the webhook protocol

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        return None  # not part of the webhook protocol

    def node_states(self) -> dict[str, NodeReport] | None:
        return None

    def job_states(self, jobs: list[Job]) -> dict[int, JobReport]:
        return {}

    def read_log(self, job: Job, offset: int, limit: int, *, from_end: bool = False) -> LogChunk:
        return LogChunk(
            reason="the webhook cluster's protocol carries no job logs: read them in that cluster"
        )
