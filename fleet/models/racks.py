"""The hardware: racks (NVLink domains), nodes (compute trays) and GPUs."""

from __future__ import annotations

import uuid

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from fleet.choices import GpuHealth, NodeState, RackKind, RuleTest, Verdict


class Rack(models.Model):
    """One NVLink domain. For an NVL72 that is a whole rack of 18 nodes x 4 GPUs;
    an NVL36x2 cabinet is two Rack rows; an HGX node is a domain of one node."""

    name = models.CharField(max_length=100, unique=True)
    external_id = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Identity in the source of truth, e.g. the ClusterUUID.CliqueId of "
        "nvidia.com/gpu.clique, or a Slurm block name.",
    )
    kind = models.CharField(max_length=16, choices=RackKind.choices, default=RackKind.NVL72)
    nodes_per_domain = models.PositiveSmallIntegerField(
        default=18, validators=[MinValueValidator(1)], help_text="Node slots in this domain."
    )
    gpus_per_node = models.PositiveSmallIntegerField(default=4, validators=[MinValueValidator(1)])
    spare_nodes = models.PositiveSmallIntegerField(
        default=2, help_text="Healthy nodes held back as hot spares for in-place recovery."
    )
    site = models.CharField(max_length=100, blank=True, default="")
    row = models.CharField(max_length=50, blank=True, default="")
    position = models.PositiveIntegerField(null=True, blank=True)
    # Bumped on every change to the rack, its nodes, GPUs or allocations, so live
    # views can detect a missed delta and re-fetch a snapshot.
    version = models.PositiveBigIntegerField(default=0)
    # The transaction that last changed the rack (PostgreSQL's xid), set with the
    # version: the console's ``?since=`` cursor compares
    # against it (fleet.services.racks.bump_versions says why not the version).
    changed_xid = models.PositiveBigIntegerField(default=0, db_index=True)
    # Non-empty: the rack's NVLink fabric is degraded (several nodes report fabric
    # trouble), and why; no new multi-node gangs go there. Set and cleared by
    # fleet.services.racks.set_fabric_state from the agents' readings.
    fabric_degraded = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["site", "row", "position", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(spare_nodes__lt=F("nodes_per_domain")) | Q(spare_nodes=0),
                name="rack_spares_below_node_count",
            ),
            models.UniqueConstraint(
                fields=["external_id"],
                condition=~Q(external_id=""),
                name="rack_unique_external_id",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def gpu_capacity(self) -> int:
        return self.nodes_per_domain * self.gpus_per_node


class Node(models.Model):
    """One compute tray (host) in a rack."""

    rack = models.ForeignKey(Rack, on_delete=models.PROTECT, related_name="nodes")
    slot = models.PositiveSmallIntegerField(help_text="Tray position in the rack, from 0.")
    hostname = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.HEALTHY)
    state_reason = models.CharField(max_length=500, blank=True, default="")
    state_changed_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["rack", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["rack", "slot"], name="node_unique_slot_per_rack"),
        ]

    def __str__(self) -> str:
        return self.hostname


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.UUIDField(default=uuid.uuid4, unique=True)
    health = models.CharField(max_length=16, choices=GpuHealth.choices, default=GpuHealth.OK)
    last_error = models.CharField(
        max_length=500, blank=True, default="", help_text="e.g. 'XID 79: GPU fell off the bus'"
    )
    last_xid = models.PositiveIntegerField(null=True, blank=True)
    health_changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node.hostname}/gpu{self.index}"


class GpuReading(models.Model):
    """What a GPU's agent last read from NVML (fleet.gpu_signals):
    the latest ``signals``, those the GPU does not support, and for the
    cumulative counters their running totals across resets with two rings of
    samples (``state``: counters, minutes, hours) that rates and sparklines
    read. Written by fleet.services.intake.health only, at most once a minute
    unless a counter rose or a flag changed."""

    gpu = models.OneToOneField(GPU, on_delete=models.CASCADE, related_name="reading")
    read_at = models.DateTimeField()
    temperature_c = models.FloatField(null=True, blank=True)
    signals = models.JSONField(default=dict, blank=True)
    unsupported = models.JSONField(default=list, blank=True)
    state = models.JSONField(default=dict, blank=True)
    # The worst verdict of the health rules on this reading, and the reading that
    # caused it (fleet.gpu_verdicts); blank: none.
    verdict = models.CharField(max_length=16, blank=True, default="")
    verdict_reason = models.CharField(max_length=500, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.gpu} read at {self.read_at:%Y-%m-%d %H:%M:%S}"


class HealthRule(models.Model):
    """Which signal, tested how, over which window, gives which verdict on a GPU
    (fleet.gpu_verdicts). Operators read and change them (API,
    console); fleet.services.health_rules is the only writer, and audits."""

    name = models.SlugField(max_length=100, unique=True)
    signal = models.CharField(max_length=100, help_text="e.g. ecc.volatile_corrected, remapped_rows.pending")
    test = models.CharField(max_length=16, choices=RuleTest.choices)
    threshold = models.FloatField(default=0.0)
    window_s = models.PositiveIntegerField(default=3600, help_text="For rate_above: the window, in seconds.")
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=500, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeReading(models.Model):
    """Node-level readings from its agent: the IMEX daemon's status, and the
    NVLink fabric (cluster UUID and clique) its GPUs report. Written by
    fleet.services.intake.health only."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="reading")
    read_at = models.DateTimeField()
    imex_status = models.CharField(max_length=16, blank=True, default="")
    imex_detail = models.CharField(max_length=500, blank=True, default="")
    fabric_cluster_uuid = models.CharField(max_length=100, blank=True, default="")
    fabric_clique_id = models.BigIntegerField(null=True, blank=True)
    # The distinct fabrics ([cluster UUID, clique id]) its GPUs report when they
    # disagree among themselves (a misconfigured node); empty when they agree.
    # Kept here so the fleet-wide check reads one narrow row a node
    # (fleet.services.read.fabric), not every GPU's signals.
    fabric_disagreement = models.JSONField(default=list, blank=True)
    # Non-empty: this node reports trouble with its NVLink fabric (IMEX down, a
    # fabric health mask, NVLink errors rising), and what; the rack is degraded
    # when several of its nodes do.
    fabric_trouble = models.CharField(max_length=300, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.node} read at {self.read_at:%Y-%m-%d %H:%M:%S}"
