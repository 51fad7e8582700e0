"""The audit trail. Every service that changes something calls ``record`` inside
its transaction, so the change and its audit record commit or roll back together."""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterable
from typing import Any, Protocol, cast

from django.contrib.auth.models import User
from django.db import models

from fleet.models import AuditEvent

# Set per HTTP request by RequestIdMiddleware (and per task run later) so that all
# the events one request causes can be grouped.
current_request_id: contextvars.ContextVar[uuid.UUID | None] = contextvars.ContextVar(
    "rackwise_request_id", default=None
)


class AuditActor(Protocol):
    """Who acts: a user, or something that quacks like one for the audit log (an
    AnonymousUser, a node's AgentPrincipal), whose ``pk`` is None."""

    @property
    def pk(self) -> Any: ...

    def get_username(self) -> str: ...


Actor = AuditActor | None


def actor_name(actor: Actor) -> str:
    return actor.get_username() if actor is not None else "system"


def record(
    actor: Actor,
    action: str,
    obj: models.Model,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    message: str = "",
) -> AuditEvent:
    return record_many(actor, action, [(obj, before, after, message)])[0]


def record_many(
    actor: Actor,
    action: str,
    entries: Iterable[tuple[models.Model, dict[str, Any] | None, dict[str, Any] | None, str]],
) -> list[AuditEvent]:
    """Audit many objects at once (one insert): ``(obj, before, after, message)``."""
    request_id = current_request_id.get()
    return AuditEvent.objects.bulk_create(
        AuditEvent(
            # Only a saved user has a pk.
            actor=cast(User, actor) if actor is not None and actor.pk else None,
            actor_name=actor_name(actor),
            action=action,
            object_type=obj._meta.model_name or obj.__class__.__name__.lower(),
            object_id=str(obj.pk),
            object_repr=str(obj)[:200],
            message=message[:500],
            before=before,
            after=after,
            request_id=request_id,
        )
        for obj, before, after, message in entries
    )
