"""Work: tenants, jobs, and the allocations that bind jobs to GPUs."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet.choices import JobState, Locality


class Tenant(models.Model):
    """A team or project. Submitters see and act on the jobs of their tenants.

    ``cohort``: tenants of one cohort lend each other their unused quota (one
    fleet-wide cohort by default). ``weight``: its fair share of what is left
    over, against the other tenants' weights."""

    DEFAULT_COHORT = "fleet"

    name = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="tenants", blank=True)
    cohort = models.SlugField(max_length=100, default=DEFAULT_COHORT)
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1000.0)])

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Quota(models.Model):
    """A tenant's quota of GPUs on one node shape (GPUs per node: 4 for NVL72
    and NVL36 racks, 8 for HGX nodes), as Kueue's ``nominalQuota``,
    ``borrowingLimit`` and ``lendingLimit`` (see placement.quota). Empty limits:
    no limit. Spare nodes count in no quota."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    gpus_per_node = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    nominal_gpus = models.PositiveIntegerField(default=0)
    borrowing_limit_gpus = models.PositiveIntegerField(null=True, blank=True)
    lending_limit_gpus = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__name", "gpus_per_node"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "gpus_per_node"], name="one_quota_per_tenant_shape")
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.nominal_gpus} GPUs on {self.gpus_per_node}-GPU nodes"


class RackReservation(models.Model):
    """A whole rack (one NVLink domain) reserved for a tenant inside its nominal
    quota: the tenant's work goes there first, other tenants' work only while
    it is idle, and a reclaim by the tenant looks there first. Its GPUs
    outside spare nodes count towards the tenant's nominal quota of the rack's
    node shape. Written by fleet.services.tenants.quotas only."""

    rack = models.OneToOneField("fleet.Rack", on_delete=models.CASCADE, related_name="reservation")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="reserved_racks")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__name", "rack__name"]

    def __str__(self) -> str:
        return f"{self.rack} reserved for {self.tenant}"


class Job(models.Model):
    """A request for GPUs. The shape is stored normalised: ``num_gpus`` always, and
    for multi-node gangs ``num_nodes`` x ``gpus_per_node`` as well."""

    # The job's shape (normalised at submission) and how it may be placed: the
    # fields a submission sets from the request and the engine reads, by the
    # same names (``JobSpec``, ``placement.model.JobRequest``).
    SHAPE = ("num_gpus", "num_nodes", "gpus_per_node", "segment_nodes")
    PLACEMENT_TERMS = ("locality", "priority", "preemptible")

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    num_gpus = models.PositiveIntegerField()
    num_nodes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Whole nodes for a gang; empty for a sub-node job."
    )
    gpus_per_node = models.PositiveSmallIntegerField(null=True, blank=True)
    segment_nodes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Nodes that must share one NVLink domain."
    )
    locality = models.CharField(max_length=16, choices=Locality.choices, default=Locality.REQUIRED)
    priority = models.IntegerField(default=0)
    preemptible = models.BooleanField(default=True)
    checkpoint_interval_s = models.PositiveIntegerField(default=3600)
    expected_duration_s = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    state_reason = models.CharField(max_length=500, blank=True, default="")
    # What the engine decided that allocation rows cannot say: {"segments":
    # [[node id, ...], ...], "reason": "...", "choices": [...]}. Where the job
    # runs is its allocations (fleet.services.jobs.allocations.placement_of shows both).
    # Allocation rows are the truth for which GPUs are held; this keeps the why.
    placement = models.JSONField(default=dict, blank=True)
    # Incremented each time the job's processes (re)start; a simulated completion
    # scheduled for an earlier run is ignored.
    attempt = models.PositiveIntegerField(default=0)
    submitted_at = models.DateTimeField(default=timezone.now)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A client's Idempotency-Key for the submission (unique per tenant), and a
    # digest of what was asked, so a retry returns this job and a reused key
    # with a different request is refused.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_digest = models.CharField(max_length=64, blank=True, default="")
    # The job's id in the cluster that runs it (a Slurm job id), once it has one.
    external_id = models.CharField(max_length=64, null=True, blank=True, db_index=True)
    # What the cluster needs to run it, per cluster kind: {"slurm": {"script": ...}}.
    # A job adopted from the cluster has {"slurm": {"adopted": true, ...}}.
    cluster_spec = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["state", "priority"])]
        constraints = [
            models.CheckConstraint(condition=Q(num_gpus__gte=1), name="job_positive_gpus"),
            models.CheckConstraint(
                condition=Q(num_nodes__isnull=True, gpus_per_node__isnull=True)
                | Q(num_nodes__gte=1, gpus_per_node__gte=1),
                name="job_nodes_and_gpus_per_node_together",
            ),
            # The database, not a read-then-write, makes two submissions with one
            # key impossible (two concurrent retries race here).
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_per_tenant",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def is_gang(self) -> bool:
        return self.num_nodes is not None


class Allocation(models.Model):
    """A job holding one GPU. Active while ``released_at`` is empty."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey("fleet.GPU", on_delete=models.PROTECT, related_name="allocations")
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["gpu"]
        constraints = [
            # The last line of defence: whatever the code above does, the database
            # refuses a second active allocation of the same GPU.
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True),
                name="allocation_one_active_per_gpu",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} -> {self.gpu_id}"
