"""Who did what to which object, when, with before and after."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEvent(models.Model):
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    # Kept even if the user is deleted; "system" for workers and commands.
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=32, db_index=True)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    message = models.CharField(max_length=500, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    # Groups the events written by one request or one task run.
    request_id = models.UUIDField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"])]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.object_type}:{self.object_id}"
