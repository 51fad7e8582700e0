"""Decisions waiting for, or carried out after, approval."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from fleet.choices import DEFAULT_APPROVAL, ActionKind, ActionState, ApprovalMode


class Action(models.Model):
    """One decision (a placement, a recovery, a defrag plan, a drain) as ordered
    steps. States move only through ``fleet.services.action_lifecycle.transition``
    (row lock and check), so a redelivered task is harmless::

        proposed -> approved -> executing -> succeeded | failed
        proposed -> rejected | expired | cancelled;  approved -> expired | cancelled
        executing -> cancelled
    """

    kind = models.CharField(max_length=20, choices=ActionKind.choices)
    state = models.CharField(max_length=16, choices=ActionState.choices, default=ActionState.PROPOSED)
    title = models.CharField(max_length=300)
    # Every job the plan touches (placed, recovered, moved or preempted). The
    # scheduler leaves a job alone while an open action holds it.
    jobs = models.ManyToManyField("fleet.Job", related_name="actions", blank=True)
    # {"steps": [{"op": ..., ...}], "engine": <the engine's plan as a dict>}
    plan = models.JSONField(default=dict)
    cost_gpu_hours = models.FloatField(default=0.0)
    # {"jobs_made_placeable": [...], "fragmentation_before": x, "fragmentation_after": y, ...}
    benefit = models.JSONField(default=dict, blank=True)
    fleet_version = models.PositiveBigIntegerField(default=0)
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    proposed_by_name = models.CharField(max_length=150, default="system")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    decided_by_name = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.CharField(max_length=500, blank=True, default="")
    step_index = models.PositiveIntegerField(default=0, help_text="Steps completed so far.")
    progress = models.FloatField(default=0.0, help_text="0..1")
    # When the step in flight was handed to the cluster adapter (webhook: the POST).
    step_started_at = models.DateTimeField(null=True, blank=True)
    # Webhook cluster: results reported by signed callbacks, by step index.
    callbacks = models.JSONField(default=dict, blank=True)
    log = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A proposal waiting for an operator was last found still the best decision
    # at this time (fleet.services.proposals re-checks it as the fleet changes).
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "kind"])]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}: {self.title}"

    @property
    def steps(self) -> list[dict]:
        return self.plan.get("steps", [])


class ApprovalPolicy(models.Model):
    """Whether actions of a kind run automatically or wait for an operator."""

    kind = models.CharField(max_length=20, choices=ActionKind.choices, unique=True)
    mode = models.CharField(max_length=10, choices=ApprovalMode.choices)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind"]
        verbose_name_plural = "approval policies"

    def __str__(self) -> str:
        return f"{self.kind}: {self.mode}"

    @classmethod
    def mode_for(cls, kind: str) -> str:
        row = cls.objects.filter(kind=kind).values_list("mode", flat=True).first()
        return row or DEFAULT_APPROVAL[kind]


class AgentToken(models.Model):
    """A secret that lets one node's agent post heartbeats for that node only."""

    node = models.OneToOneField("fleet.Node", on_delete=models.CASCADE, related_name="agent_token")
    key = models.CharField(max_length=80, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"agent token for {self.node}"
