"""Outgoing event webhooks: endpoints operators register, and one delivery row
per (event, endpoint) written in the same transaction as the change it reports
(the outbox pattern), so an event is sent if and only if its change committed."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.utils import timezone

from fleet.choices import DeliveryState


def safe_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what audit records and listings of
    other places may show. The path and query often are the credential (a chat
    service's incoming-webhook token), and user:pass certainly is."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(malformed URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


class WebhookEndpoint(models.Model):
    """A URL that receives HMAC-signed POSTs for the event types it lists."""

    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True, default="")
    # A plain JSON list of WebhookEvent values.
    event_types = models.JSONField(default=list)
    # Kept readable because every delivery is signed with it; shown to the
    # operator once, on create and on rotation.
    secret = models.CharField(max_length=100)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        # Scheme and host only: this string is the audit log's object label, which
        # viewers read, and a webhook URL's path or query is often its credential.
        return f"webhook #{self.pk} {safe_url(self.url)}"


class WebhookDelivery(models.Model):
    """One event for one endpoint, with its attempts so far.

    ``next_attempt_at`` is when the next attempt is due; a worker claims an
    attempt by moving it forward (compare-and-set), so a redelivered task cannot
    send the same delivery twice at once."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=40)
    # The same for every endpoint's copy of one event (receivers deduplicate on it).
    event_id = models.UUIDField(default=uuid.uuid4, db_index=True)
    # The envelope as sent: {"id", "type", "created_at", "data"}.
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=12, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(fields=["state", "next_attempt_at"]),
            models.Index(fields=["endpoint", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} -> webhook #{self.endpoint_id} ({self.state})"
