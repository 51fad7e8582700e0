"""Decisions waiting for, or carried out after, approval."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from fleet.choices import DEFAULT_APPROVAL, ActionKind, ActionState, ApprovalMode


class Action(models.Model):
    """One decision (a placement, a recovery, a defrag plan, a drain) as ordered
    steps. States move only through ``fleet.services.actions.lifecycle.transition``
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
    # {"steps": [{"op": ..., ...}], "engine": {...}, "request": {...}}: the typed
    # steps (fleet.steps) are the plan; "engine" keeps only what steps cannot
    # say (a recovery's or defrag's moves with their costs; a placement has
    # none: its allocate step is the whole record); "request" what was asked.
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
    # at this time (fleet.services.decisions.recheck re-checks it as the fleet changes).
    checked_at = models.DateTimeField(null=True, blank=True)
    # The plan this one was made to replace, when the fleet moved away from that
    # one (a re-plan keeps its request; fleet.services.decisions.defrag.replan).
    replaces = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="replacements"
    )
    # What the end of a plan that stopped jobs cost, in GPU-hours: the work lost
    # by every job it stopped (each restarts from its checkpoint, on its old
    # nodes or its new ones). None until a plan that holds nodes ends.
    lost_gpu_hours = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "kind"])]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}: {self.title}"

    @property
    def steps(self) -> list[dict]:
        return self.plan.get("steps", [])

    @property
    def ended_early(self) -> bool:
        """Ended without carrying its plan out (expired, rejected, cancelled, failed)."""
        return self.state in (
            ActionState.EXPIRED,
            ActionState.REJECTED,
            ActionState.CANCELLED,
            ActionState.FAILED,
        )

    @property
    def held_racks(self) -> list[dict]:
        """The nodes held for this plan by rack, in one query: ``[{"rack": name,
        "emptied": n, "filled": m}]`` (the nodes themselves are outlined in the
        racks' grids)."""
        out: dict[str, dict] = {}
        for rack, role in self.holds.order_by("node__rack__name").values_list("node__rack__name", "role"):
            entry = out.setdefault(rack, {"rack": rack, "emptied": 0, "filled": 0})
            entry["filled" if role == HoldRole.FILL else "emptied"] += 1
        return list(out.values())

    @property
    def replaced_by(self) -> int | None:
        """The id of the plan made to replace this one, if any."""
        return self.replacements.order_by("-id").values_list("pk", flat=True).first()


class HoldRole(models.TextChoices):
    EMPTY = "empty", "Emptied by the plan"
    FILL = "fill", "Filled by the plan"


class NodeHold(models.Model):
    """A node held for an approved or executing plan, from its approval to its
    end: the nodes it empties and the nodes it fills. The scheduler, recovery and
    other plans see a held node as taking no new work (``fleet.engine``), and the
    services refuse to place anything else there. Taken and released only by
    ``fleet.services.actions.lifecycle``, in the transaction that approves or ends
    the action; the row goes with the action, so no crash leaves a hold behind.

    A node is held by one action at most (the primary key): two plans can never
    both count on it."""

    node = models.OneToOneField("fleet.Node", on_delete=models.CASCADE, primary_key=True, related_name="hold")
    action = models.ForeignKey(Action, on_delete=models.CASCADE, related_name="holds")
    role = models.CharField(max_length=8, choices=HoldRole.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["node_id"]

    def __str__(self) -> str:
        return f"node {self.node.hostname} held for action #{self.action_id} ({self.role})"


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
