"""Event webhooks: operators register endpoints for event types; every event is
POSTed, HMAC-signed, to each subscribed endpoint, retried with backoff, and its
history kept.

The outbox pattern: :func:`emit` inserts one :class:`WebhookDelivery` row per
subscribed endpoint *in the caller's transaction*, so an event goes out if and
only if the change it reports commits, and asks a worker on the ``webhooks``
queue to send it once the transaction commits. Sending happens there, never in
the caller, so a slow or dead endpoint cannot slow the scheduler down.

A delivery is attempted by :func:`attempt_delivery`: claim the attempt by
compare-and-set (``next_attempt_at`` moves past the request's timeout, so a
redelivered task finds it not due), POST, and record the outcome: 2xx is
``succeeded``; anything else is ``retrying`` with an exponential backoff, or
``dead`` after ``RACKWISE_WEBHOOK_MAX_ATTEMPTS``. A periodic sweep
(:func:`due_deliveries`) picks up attempts whose task was lost.
"""

from __future__ import annotations

import json
import random
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleet import dispatch, signing
from fleet.choices import OPEN_DELIVERY_STATES, WEBHOOK_PING, DeliveryState, Role, WebhookEvent
from fleet.models import GPU, Action, GpuReading, Job, Node, Rack, Tenant, WebhookDelivery, WebhookEndpoint
from fleet.permissions import has_role
from fleet.services import audit, webhook_targets
from fleet.services.errors import Conflict, InvalidInput, NotAllowed

EVENT_HEADER = "X-Rackwise-Event"
DELIVERY_HEADER = "X-Rackwise-Delivery"
# A claimed attempt stays claimed this much longer than the request may take,
# so a worker that dies mid-request leaves it to the sweep, not to a twin.
LEASE_SLACK_S = 30.0
# The sweep leaves an attempt alone for this long after it falls due: its own
# countdown task normally gets there first.
SWEEP_GRACE_S = 2.0
SWEEP_BATCH = 500
# The sweep queues an overdue delivery again at most this often.
SWEEP_NUDGE_S = 300

_jitter = random.Random()


def _require_operator(actor) -> None:
    if not has_role(actor, Role.OPERATOR):
        raise NotAllowed("only operators can manage webhooks")


def _snapshot(endpoint: WebhookEndpoint) -> dict[str, Any]:
    # Scheme and host only: viewers read the audit log, and a webhook URL's path
    # or query is often its credential.
    return {
        "url": webhook_targets.safe_url(endpoint.url),
        "description": endpoint.description,
        "event_types": endpoint.event_types,
        "active": endpoint.active,
    }


# --- endpoints ------------------------------------------------------------------


def _clean_url(url: Any) -> str:
    if not isinstance(url, str) or not url.strip():
        raise InvalidInput({"url": ["a URL is required, e.g. https://hooks.example.com/rackwise"]})
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput({"url": [f"{url!r} is not an http:// or https:// URL with a host"]})
    if len(url) > 500:
        raise InvalidInput({"url": ["the URL is longer than 500 characters"]})
    try:
        webhook_targets.check_registration(url)
    except webhook_targets.TargetRefused as exc:
        raise InvalidInput({"url": [str(exc)]}) from None
    return url


def _clean_event_types(event_types: Any) -> list[str]:
    valid = ", ".join(WebhookEvent.values)
    if not isinstance(event_types, list) or not event_types:
        raise InvalidInput({"event_types": [f"give a non-empty list of event types; valid: {valid}"]})
    unknown = [t for t in event_types if t not in WebhookEvent.values]
    if unknown:
        names = ", ".join(repr(t) for t in unknown)
        raise InvalidInput({"event_types": [f"unknown event type {names}; valid: {valid}"]})
    return sorted(set(event_types))


_CLEANERS: dict[str, Callable[[Any], Any]] = {
    "url": _clean_url,
    "event_types": _clean_event_types,
    "description": lambda v: (v or "")[:200],
    "active": bool,
}


def _cleaned(fields: dict[str, Any]) -> dict[str, Any]:
    """Every field cleaned, or one InvalidInput naming every bad field at once."""
    errors: dict[str, list[str]] = {
        name: ["not a field you can change"] for name in sorted(set(fields) - set(_CLEANERS))
    }
    clean: dict[str, Any] = {}
    for name, value in fields.items():
        if name in _CLEANERS:
            try:
                clean[name] = _CLEANERS[name](value)
            except InvalidInput as exc:
                errors.update(exc.errors)
    if errors:
        raise InvalidInput(errors)
    return clean


def create_endpoint(
    actor, *, url: str, event_types: list[str], description: str = "", active: bool = True
) -> WebhookEndpoint:
    """Register an endpoint. Its signing secret is generated here; the caller
    shows it to the operator once (it is never listed)."""
    _require_operator(actor)
    clean = _cleaned({"url": url, "event_types": event_types, "description": description, "active": active})
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            **clean,
            secret=secrets.token_urlsafe(32),
            created_by=actor if actor is not None and actor.pk else None,
        )
        audit.record(actor, "webhook.create", endpoint, after=_snapshot(endpoint))
    return endpoint


def update_endpoint(actor, endpoint_id: int, **changes: Any) -> WebhookEndpoint:
    """Change any of ``url``, ``event_types``, ``description``, ``active``."""
    _require_operator(actor)
    clean = _cleaned(changes)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint_id)
        before = _snapshot(endpoint)
        for name, value in clean.items():
            setattr(endpoint, name, value)
        endpoint.save()
        audit.record(actor, "webhook.update", endpoint, before=before, after=_snapshot(endpoint))
    return endpoint


def delete_endpoint(actor, endpoint_id: int) -> None:
    """Remove an endpoint and its delivery history."""
    _require_operator(actor)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint_id)
        audit.record(actor, "webhook.delete", endpoint, before=_snapshot(endpoint))
        endpoint.delete()


def rotate_secret(actor, endpoint_id: int) -> WebhookEndpoint:
    """A new signing secret; deliveries from now on are signed with it."""
    _require_operator(actor)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint_id)
        endpoint.secret = secrets.token_urlsafe(32)
        endpoint.save(update_fields=["secret", "updated_at"])
        audit.record(actor, "webhook.rotate_secret", endpoint, message="signing secret rotated")
    return endpoint


def send_test(actor, endpoint_id: int) -> WebhookDelivery:
    """Queue a ``ping`` event for one endpoint, whatever it subscribes to."""
    _require_operator(actor)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
        if not endpoint.active:
            raise Conflict(f"webhook #{endpoint.pk} is inactive; activate it before testing it")
        data = {"webhook": endpoint.pk, "message": f"test sent by {audit.actor_name(actor)}"}
        delivery = _insert(WEBHOOK_PING, [data], [endpoint])[0]
        audit.record(actor, "webhook.test", endpoint, after={"delivery": delivery.pk})
    return delivery


def redeliver(actor, delivery_id: int) -> WebhookDelivery:
    """Send a finished delivery's event again, as a new delivery (same event id,
    so receivers can tell it is the same event)."""
    _require_operator(actor)
    with transaction.atomic():
        old = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
        if old.state in OPEN_DELIVERY_STATES:
            raise Conflict(f"delivery #{old.pk} is {old.state}; it is still being delivered")
        now = timezone.now()
        new = WebhookDelivery.objects.create(
            endpoint=old.endpoint,
            event_type=old.event_type,
            event_id=old.event_id,
            payload=old.payload,
            created_at=now,
            next_attempt_at=now,
        )
        audit.record(actor, "webhook.redeliver", old.endpoint, after={"delivery": new.pk, "of": old.pk})
        dispatch.after_commit("fleet.tasks.deliver_webhooks", [new.pk])
    return new


# --- emitting -------------------------------------------------------------------


def _subscribers(event_type: str) -> list[WebhookEndpoint]:
    return list(
        WebhookEndpoint.objects.filter(active=True, event_types__contains=[event_type]).only(
            "id", "event_types"
        )
    )


def _insert(event_type: str, items: list[dict], endpoints: list[WebhookEndpoint]) -> list[WebhookDelivery]:
    now = timezone.now()
    rows = []
    for data in items:
        event_id = uuid.uuid4()
        envelope = {"id": str(event_id), "type": event_type, "created_at": now.isoformat(), "data": data}
        rows += [
            WebhookDelivery(
                endpoint=e,
                event_type=event_type,
                event_id=event_id,
                payload=envelope,
                created_at=now,
                next_attempt_at=now,
            )
            for e in endpoints
        ]
    deliveries = WebhookDelivery.objects.bulk_create(rows)
    dispatch.after_commit("fleet.tasks.deliver_webhooks", [d.pk for d in deliveries])
    return deliveries


def emit(event_type: str, data: dict | Callable[[], dict]) -> int:
    """Record one event for every active endpoint subscribed to it, in the
    caller's transaction. ``data`` may be a function, called only when someone
    subscribes. Returns the number of deliveries queued."""
    return emit_many(event_type, [data] if isinstance(data, dict) else _lazy(data))


def _lazy(build: Callable[[], dict]) -> Iterator[dict]:
    yield build()


def emit_many(event_type: str, items: Iterable[dict]) -> int:
    """Record many events of one type (one insert). ``items`` is consumed only
    when an endpoint subscribes, so a generator costs nothing otherwise."""
    if event_type not in WebhookEvent.values:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    endpoints = _subscribers(event_type)
    if not endpoints:
        return 0
    items = list(items)
    if not items:
        return 0
    return len(_insert(event_type, items, endpoints))


# Event data. Plain JSON: ids, names, states, ISO times.


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def jobs_placed(jobs: Iterable[Job], placements: dict[int, dict]) -> Iterator[dict]:
    """``job.placed`` data for jobs just placed (tenant names in one query), with
    each one's placement (``jobs.placement_of``) by job id."""
    jobs = list(jobs)
    tenants = dict(Tenant.objects.filter(pk__in={j.tenant_id for j in jobs}).values_list("pk", "name"))
    for job in jobs:
        yield {
            "job": {
                "id": job.pk,
                "name": job.name,
                "tenant": tenants.get(job.tenant_id),
                "state": job.state,
                "num_gpus": job.num_gpus,
                "num_nodes": job.num_nodes,
                "gpus_per_node": job.gpus_per_node,
                "segment_nodes": job.segment_nodes,
                "locality": job.locality,
                "priority": job.priority,
                "placed_at": _iso(job.placed_at),
                "placement": placements.get(job.pk, {}),
            }
        }


def node_failed(node: Node, job_ids: Iterable[int]) -> Callable[[], dict]:
    """``node.failed`` data: the node and the jobs it interrupted."""
    return lambda: {
        "node": {
            "id": node.pk,
            "hostname": node.hostname,
            "rack": node.rack.name,
            "slot": node.slot,
            "state": node.state,
            "state_reason": node.state_reason,
            "state_changed_at": _iso(node.state_changed_at),
        },
        "jobs_interrupted": sorted(set(job_ids)),
    }


def gpu_verdict(gpu: GPU, node: Node, reading: GpuReading) -> Callable[[], dict]:
    """``gpu.verdict`` data: the GPU, its node, the verdict and the reading that caused it."""
    return lambda: {
        "gpu": {"index": gpu.index, "uuid": str(gpu.uuid)},
        "node": {"id": node.pk, "hostname": node.hostname, "rack": node.rack.name, "state": node.state},
        "verdict": reading.verdict,
        "reason": reading.verdict_reason,
        "read_at": _iso(reading.read_at),
    }


def rack_fabric(rack: Rack) -> dict:
    """``rack.fabric`` data: the rack and why its fabric is degraded ('' when healthy again)."""
    return {"rack": {"id": rack.pk, "name": rack.name}, "fabric_degraded": rack.fabric_degraded}


def action_data(action: Action, jobs: Iterable[int] | None = None) -> dict:
    """``action.*`` data: the action as it is now (its final state for
    ``action.finished``)."""
    return {
        "action": {
            "id": action.pk,
            "kind": action.kind,
            "state": action.state,
            "title": action.title,
            "jobs": sorted(action.jobs.values_list("pk", flat=True) if jobs is None else jobs),
            "steps": len(action.steps),
            "steps_done": action.step_index,
            "cost_gpu_hours": action.cost_gpu_hours,
            "benefit": action.benefit,
            "proposed_by": action.proposed_by_name,
            "decided_by": action.decided_by_name,
            "decision_note": action.decision_note,
            "error": action.error,
            "created_at": _iso(action.created_at),
            "decided_at": _iso(action.decided_at),
            "started_at": _iso(action.started_at),
            "finished_at": _iso(action.finished_at),
        }
    }


def action_finished(action: Action) -> Callable[[], dict]:
    return lambda: action_data(action)


def _job(job: Job) -> dict:
    return {
        "id": job.pk,
        "name": job.name,
        "tenant": job.tenant.name,
        "state": job.state,
        "num_gpus": job.num_gpus,
        "priority": job.priority,
        "preemptible": job.preemptible,
    }


def reclaim_data(action: Action, jobs: Iterable[int] | None = None) -> dict:
    """``reclaim.*`` data: the job the reclaim starts and its tenant, the
    victims it preempts (with theirs), the GPU-hours it was expected to lose
    and, once it ended, those it lost; ``borrowed`` when the victims held GPUs
    beyond their tenants' quotas (else they are the tenant's own lower-priority
    work). The action itself as in ``action.*``."""
    ids = sorted(action.jobs.values_list("pk", flat=True) if jobs is None else jobs)
    victim_ids = [int(v) for v in (action.benefit or {}).get("victims", [])]
    rows = {j.pk: j for j in Job.objects.filter(pk__in=ids).select_related("tenant")}
    started = next((rows[i] for i in ids if i not in victim_ids and i in rows), None)
    return {
        "job": _job(started) if started else None,
        "tenant": started.tenant.name if started else None,
        "victims": [_job(rows[v]) for v in victim_ids if v in rows],
        "borrowed": bool((action.benefit or {}).get("reclaim")),
        "gpu_hours": action.cost_gpu_hours,
        "lost_gpu_hours": action.lost_gpu_hours,
        **action_data(action, ids),
    }


# --- delivering -----------------------------------------------------------------


def backoff_s(attempt: int) -> float:
    """Wait before retrying after failed attempt number ``attempt`` (1-based):
    base x 3^(n-1), capped, with +-20% jitter so a fleet of retries spreads out."""
    base = settings.RACKWISE_WEBHOOK_BACKOFF_S * 3 ** (attempt - 1)
    return min(settings.RACKWISE_WEBHOOK_BACKOFF_MAX_S, base) * _jitter.uniform(0.8, 1.2)


@dataclass(frozen=True)
class Outcome:
    message: str
    retry_in: float | None = None  # seconds until the next attempt, if any


def attempt_delivery(delivery_id: int, now: datetime | None = None) -> Outcome:
    """Make the delivery's next attempt if it is due.

    1. Claim it: ``attempts`` +1 and ``next_attempt_at`` past this request's
       timeout, compare-and-set on the attempt count, so a second worker (a
       redelivered task, the sweep) finds it claimed or not due.
    2. Resolve the endpoint's host and check every address again
       (``fleet.services.webhook_targets``: DNS may have changed since it was
       registered); a refused address makes the delivery dead at once.
    3. POST the envelope, signed with the endpoint's secret, to the address just
       checked (outside any transaction: the request may take the whole timeout).
    4. Record the answer's status and size, never its body (the history must
       not read back what an endpoint inside the network says): succeeded,
       retrying (with the next attempt's time), or dead after the last attempt.
    """
    now = now or timezone.now()
    timeout = settings.RACKWISE_WEBHOOK_DELIVERY_TIMEOUT_S
    delivery = WebhookDelivery.objects.select_related("endpoint").filter(pk=delivery_id).first()
    if delivery is None:
        return Outcome("gone")
    if delivery.state not in OPEN_DELIVERY_STATES:
        return Outcome(delivery.state)
    if delivery.next_attempt_at and delivery.next_attempt_at > now:
        return Outcome("not due")
    attempt = delivery.attempts + 1
    claimed = WebhookDelivery.objects.filter(
        pk=delivery.pk, state__in=OPEN_DELIVERY_STATES, attempts=delivery.attempts
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=timeout + LEASE_SLACK_S))
    if claimed != 1:
        return Outcome("claimed elsewhere")
    endpoint = delivery.endpoint
    if not endpoint.active:
        _record(delivery.pk, attempt, state=DeliveryState.DEAD, error="the endpoint was deactivated")
        return Outcome("dead: endpoint inactive")

    body = json.dumps(delivery.payload, sort_keys=True, separators=(",", ":")).encode()
    started = time.monotonic()
    status: int | None = None
    try:
        target = webhook_targets.resolve(endpoint.url)
        answer = signing.post_signed(
            endpoint.url,
            endpoint.secret,
            body,
            timeout=timeout,
            headers={EVENT_HEADER: delivery.event_type, DELIVERY_HEADER: str(delivery.pk)},
            connect_to=target.address,
        )
        status = answer.status
        error = "" if 200 <= status < 300 else answer.describe()
    except webhook_targets.TargetRefused as exc:
        # Retrying cannot help until an operator changes the URL or the allow-list.
        error = f"refused: {exc}"
        _record(delivery.pk, attempt, state=DeliveryState.DEAD, error=error)
        return Outcome(f"dead: {error[:200]}")
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - started
    fields: dict[str, Any] = {"status": status, "duration_ms": round(elapsed * 1000), "error": error}
    if not error:
        _record(delivery.pk, attempt, state=DeliveryState.SUCCEEDED, delivered_at=timezone.now(), **fields)
        return Outcome("succeeded")
    if attempt >= settings.RACKWISE_WEBHOOK_MAX_ATTEMPTS:
        _record(delivery.pk, attempt, state=DeliveryState.DEAD, **fields)
        return Outcome(f"dead after {attempt} attempts: {error[:200]}")
    wait = backoff_s(attempt)
    _record(
        delivery.pk,
        attempt,
        state=DeliveryState.RETRYING,
        next_attempt_at=now + timedelta(seconds=elapsed + wait),
        **fields,
    )
    return Outcome(f"attempt {attempt} failed, retrying in {wait:.1f} s: {error[:200]}", retry_in=wait)


def _record(
    delivery_id: int,
    attempt: int,
    *,
    state: str,
    status: int | None = None,
    duration_ms: int | None = None,
    error: str = "",
    delivered_at: datetime | None = None,
    next_attempt_at: datetime | None = None,
) -> None:
    # Only while our claim stands (nobody made a later attempt meanwhile).
    WebhookDelivery.objects.filter(pk=delivery_id, attempts=attempt, state__in=OPEN_DELIVERY_STATES).update(
        state=state,
        last_status_code=status,
        last_duration_ms=duration_ms,
        last_error=error[:2000],
        delivered_at=delivered_at,
        next_attempt_at=next_attempt_at,
    )


def due_deliveries(now: datetime | None = None, limit: int = SWEEP_BATCH) -> list[int]:
    """Open deliveries whose next attempt is overdue (their task was lost, or
    their worker died mid-request), oldest first."""
    cutoff = (now or timezone.now()) - timedelta(seconds=SWEEP_GRACE_S)
    due = WebhookDelivery.objects.filter(state__in=OPEN_DELIVERY_STATES, next_attempt_at__lte=cutoff)
    return list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
