from __future__ import annotations

import math
import re

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.choices import Locality
from fleet.models import GPU, AuditEvent, Job, Node, Rack
from fleet.permissions import sees_all_tenants
from fleet.services.jobs import allocations as job_allocations
from fleet.services.nodes.moves import MOVES, moves_for
from fleet.services.read.job_logs import MAX_OFFSET, MAX_TAIL_LINES

MAX_INT32 = 2**31 - 1  # the range of the integer columns sizes and counts land in


class FiniteFloatField(serializers.FloatField):
    """A float that is a number: "nan" passes min/max checks (every comparison with
    NaN is false) and "inf" is not a size."""

    def to_internal_value(self, data) -> float:
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("invalid")
        return value


class KnownFieldsOnly(serializers.Serializer):
    """A request body with only this serializer's fields: a misspelt one
    (``duration_s`` for ``expected_duration_s``, ``confrim`` for ``confirm``) is a
    400 naming it and the fields there are, not dropped in silence (the CLI checks
    job files alike); the OpenAPI schema says ``additionalProperties: false``
    (fleet.api.schema). Every body a person writes uses it; the node agent's
    heartbeat and a receiver's step callback do not, so an older server takes a
    newer agent's or receiver's body."""

    refuses_unknown_fields = True

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError(
                    {k: [f"unknown field; known fields: {known}"] for k in unknown}
                )
        return super().to_internal_value(data)


SLURM_NAME = r"^[A-Za-z0-9_.+-]{1,64}$"  # a partition or an account
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
MAX_SCRIPT_CHARS = 100_000
MAX_ENV_VARS = 100


class SlurmSpecSerializer(KnownFieldsOnly):
    """How Slurm runs the job: a batch script, or a command run with ``srun`` on
    every node. Rackwise adds the nodes, the segment and the GPUs."""

    script = serializers.CharField(
        max_length=MAX_SCRIPT_CHARS,
        required=False,
        trim_whitespace=False,
        help_text="A batch script starting with #! (e.g. #!/bin/bash).",
    )
    command = serializers.CharField(
        max_length=10_000, required=False, help_text="A command line, run with srun on every node of the job."
    )
    partition = serializers.RegexField(
        SLURM_NAME,
        required=False,
        error_messages={"invalid": "a partition name is 1-64 of A-Z a-z 0-9 _ . + -"},
    )
    account = serializers.RegexField(
        SLURM_NAME,
        required=False,
        error_messages={"invalid": "an account name is 1-64 of A-Z a-z 0-9 _ . + -"},
    )
    time_limit_min = serializers.IntegerField(
        required=False, min_value=1, max_value=366 * 24 * 60, help_text="Slurm's --time, in minutes."
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True, trim_whitespace=False),
        required=False,
        help_text="Extra environment variables for the job.",
    )

    def validate_env(self, env: dict) -> dict:

        if len(env) > MAX_ENV_VARS:
            raise serializers.ValidationError(f"at most {MAX_ENV_VARS} variables")
        bad = sorted(k for k in env if not re.match(ENV_NAME, k))
        if bad:
            raise serializers.ValidationError(
                f"not a variable name: {', '.join(bad)[:200]} (use A-Z, 0-9 and _)"
            )
        return env

    def validate(self, attrs: dict) -> dict:
        if ("script" in attrs) == ("command" in attrs):
            raise serializers.ValidationError({"script": ["give either script or command (one of them)"]})
        if "script" in attrs and not attrs["script"].startswith("#!"):
            raise serializers.ValidationError(
                {"script": ["a batch script must start with #! (e.g. #!/bin/bash)"]}
            )
        if "command" in attrs and not attrs["command"].strip():
            raise serializers.ValidationError({"command": ["must not be blank"]})
        return attrs


class JobSubmitSerializer(KnownFieldsOnly):
    """A job request. Give ``num_gpus``, or ``num_nodes`` with ``gpus_per_node``."""

    name = serializers.CharField(max_length=200)
    tenant = serializers.CharField(max_length=100, required=False, help_text="Defaults to your only tenant.")
    # Capped at the columns' range so that a 400-digit number is a 400 here, not an
    # OverflowError in the shape arithmetic; the service then bounds each by the fleet.
    num_gpus = serializers.IntegerField(required=False, max_value=MAX_INT32)
    num_nodes = serializers.IntegerField(required=False, max_value=MAX_INT32)
    gpus_per_node = serializers.IntegerField(required=False, max_value=MAX_INT32)
    segment_nodes = serializers.IntegerField(
        required=False,
        max_value=MAX_INT32,
        help_text="Nodes that must share one rack; default: the whole job.",
    )
    locality = serializers.ChoiceField(
        choices=Locality.choices,
        default=Locality.REQUIRED,
        error_messages={"invalid_choice": "unknown locality {input!r}; use required, preferred or none"},
    )
    priority = serializers.IntegerField(default=0, min_value=-1000, max_value=1000)
    preemptible = serializers.BooleanField(default=True)
    # Capped at the column's range (PositiveIntegerField), so a huge value is a 400, not a 500.
    checkpoint_interval_s = serializers.IntegerField(default=3600, min_value=60, max_value=2**31 - 1)
    expected_duration_s = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    slurm = SlurmSpecSerializer(
        required=False,
        help_text="How Slurm runs the job; required when Rackwise drives Slurm (RACKWISE_CLUSTER=slurm).",
    )
    idempotency_key = serializers.CharField(
        max_length=200,
        required=False,
        help_text="Or the Idempotency-Key header: a retry with the same key returns the job "
        "the first submission created (200) instead of creating another.",
    )

    def validate(self, attrs: dict) -> dict:

        if getattr(settings, "RACKWISE_CLUSTER", "simulated") == "slurm" and "slurm" not in attrs:
            raise serializers.ValidationError(
                {"slurm": ["this fleet runs on Slurm: give slurm.script (a batch script) or slurm.command"]}
            )
        header = self.context.get("idempotency_key_header")
        if header is not None:
            header = header.strip()
            if not header or len(header) > 200:
                raise serializers.ValidationError(
                    {"idempotency_key": ["the Idempotency-Key header must be 1 to 200 characters"]}
                )
            if attrs.get("idempotency_key", header) != header:
                raise serializers.ValidationError(
                    {"idempotency_key": ["differs from the Idempotency-Key header; send one key"]}
                )
            attrs["idempotency_key"] = header
        return attrs


class AllocatedNodeSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    hostname = serializers.CharField()
    rack = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())


class QuotaCheckSerializer(serializers.Serializer):
    admitted = serializers.BooleanField(help_text="Whether its tenant's quota lets it reach placement now.")
    reason = serializers.CharField(help_text="The numbers: what the tenant holds, its quota, its borrowing.")


class WhatIfSerializer(serializers.Serializer):
    """What would happen to a job submitted now (nothing is submitted)."""

    starts_now = serializers.BooleanField()
    summary = serializers.CharField(
        help_text="One line: where it would start, or why it waits and until when."
    )
    reason = serializers.CharField(help_text="The engine's reason for its choice, or for waiting.")
    placement = AllocatedNodeSerializer(many=True, help_text="Where it would start now; empty if it waits.")
    racks = serializers.ListField(child=serializers.CharField())
    expected_start = serializers.DateTimeField(allow_null=True)
    expected_start_in_s = serializers.FloatField(allow_null=True)
    largest_free_slice = serializers.IntegerField(help_text="The largest slice it could use now.")
    largest_free_unit = serializers.ChoiceField(choices=["nodes", "GPUs"])
    jobs_ahead = serializers.IntegerField(help_text="Waiting jobs the queue takes before it.")
    quota = QuotaCheckSerializer(
        allow_null=True, help_text="Its tenant's quota admission now; null when no quota is set."
    )


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    allocated = serializers.SerializerMethodField()
    placement = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "tenant",
            "num_gpus",
            "num_nodes",
            "gpus_per_node",
            "segment_nodes",
            "locality",
            "priority",
            "preemptible",
            "checkpoint_interval_s",
            "expected_duration_s",
            "state",
            "state_reason",
            "placement",
            "allocated",
            "submitted_at",
            "placed_at",
            "started_at",
            "finished_at",
            "external_id",
            "slurm",
        ]
        read_only_fields = fields

    slurm = serializers.SerializerMethodField()

    def get_slurm(self, job: Job) -> dict | None:
        """The job's Slurm section; environment values are left out (they may
        hold secrets), their names kept."""
        spec = (job.cluster_spec or {}).get("slurm")
        if spec is None:
            return None
        out = {k: v for k, v in spec.items() if k != "env"}
        if "env" in spec:
            out["env_names"] = sorted(spec["env"])
        return out

    @extend_schema_field(
        {
            "type": "object",
            "description": "Where the job runs (racks, nodes, its segments by node id and by hostname: "
            "its GPUs now, or where it last ran) and why (the engine's reason and choices); "
            "{} if never placed.",
        }
    )
    def get_placement(self, job: Job) -> dict:
        if self.context.get("just_submitted"):
            return {}
        return job_allocations.placement_of(job, job.allocations.all())

    def get_allocated(self, job: Job) -> list[dict]:
        """The GPUs the job holds now, grouped by node."""
        if self.context.get("just_submitted"):
            # A job just created holds nothing; not reading the database after
            # the commit means a lost connection cannot turn a 201 into a 500.
            return []
        nodes: dict[int, dict] = {}
        for alloc in job.allocations.all():
            if alloc.released_at is not None:
                continue
            node = alloc.gpu.node
            entry = nodes.setdefault(
                node.id, {"node_id": node.id, "hostname": node.hostname, "rack": node.rack.name, "gpus": []}
            )
            entry["gpus"].append(alloc.gpu.index)
        return AllocatedNodeSerializer(list(nodes.values()), many=True).data


class JobLogQuerySerializer(serializers.Serializer):
    """``GET /api/jobs/<id>/logs/``'s query: ``offset`` or ``tail``, not both."""

    offset = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_OFFSET,
        help_text="Read from this byte of the log (the last answer's next_offset); default 0.",
    )
    tail = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_TAIL_LINES,
        help_text="Read the last N lines instead (as many as the byte limit of one read holds).",
    )

    def validate(self, attrs: dict) -> dict:
        if "offset" in attrs and "tail" in attrs:
            raise serializers.ValidationError({"tail": ["give offset or tail, not both"]})
        return attrs


class JobLogSerializer(serializers.Serializer):
    """A piece of a job's log and where to go on (``fleet.services.read.job_logs``)."""

    job = serializers.IntegerField()
    state = serializers.CharField(help_text="The job's state.")
    source = serializers.CharField(
        help_text="The cluster adapter the log comes from (slurm, simulated, webhook)."
    )
    available = serializers.BooleanField(help_text="False when there is no log to read; reason says why.")
    reason = serializers.CharField(
        allow_blank=True, help_text="Why there is no log (empty when there is one)."
    )
    offset = serializers.IntegerField(help_text="Byte offset of the first line given.")
    next_offset = serializers.IntegerField(help_text="Pass as offset to read on.")
    size = serializers.IntegerField(help_text="Bytes in the log now.")
    lines = serializers.ListField(
        child=serializers.CharField(allow_blank=True), help_text="Whole lines, redacted."
    )
    truncated = serializers.BooleanField(help_text="tail: earlier lines were left out.")
    more = serializers.BooleanField(help_text="More is written past next_offset already: read again at once.")
    restarted = serializers.BooleanField(help_text="offset was past the end of the log: read from 0 instead.")
    finished = serializers.BooleanField(help_text="The job has ended: its log will not grow.")
    eof = serializers.BooleanField(help_text="finished, and next_offset is the end: a follower stops.")
    redacted_lines = serializers.IntegerField(help_text="Lines in which a secret was replaced by [redacted].")
    poll_after_s = serializers.FloatField(
        help_text="Seconds a follower waits before reading on (0: at once)."
    )


class RackSummarySerializer(serializers.Serializer):
    gpus_total = serializers.IntegerField()
    gpus_used = serializers.IntegerField()
    gpus_free = serializers.IntegerField()
    gpus_failed = serializers.IntegerField()
    gpus_unavailable = serializers.IntegerField()
    nodes_total = serializers.IntegerField()
    nodes_free = serializers.IntegerField()
    nodes_by_state = serializers.DictField(child=serializers.IntegerField())


class RackSerializer(serializers.ModelSerializer):
    summary = serializers.SerializerMethodField()

    class Meta:
        model = Rack
        fields = [
            "id",
            "name",
            "external_id",
            "kind",
            "nodes_per_domain",
            "gpus_per_node",
            "spare_nodes",
            "site",
            "row",
            "position",
            "version",
            "fabric_degraded",
            "summary",
        ]
        read_only_fields = fields

    def get_summary(self, rack: Rack) -> dict:
        return RackSummarySerializer(self.context["summaries"][rack.id]).data


class JobRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField(allow_null=True)
    tenant = serializers.CharField(allow_null=True)


class GPUCellSerializer(serializers.ModelSerializer):
    job = serializers.SerializerMethodField()

    class Meta:
        model = GPU
        fields = ["id", "index", "uuid", "health", "last_error", "last_xid", "job"]
        read_only_fields = fields

    def get_job(self, gpu: GPU) -> dict | None:
        """The job on this GPU; another tenant's job shows only its id to a submitter."""
        job = self.context["job_by_gpu"].get(gpu.id)
        if job is None:
            return None
        user = self.context["request"].user
        if sees_all_tenants(user) or job.tenant_id in self.context["my_tenant_ids"]:
            return {"id": job.id, "name": job.name, "tenant": job.tenant.name}
        return {"id": job.id, "name": None, "tenant": None}


class NodeSerializer(serializers.ModelSerializer):
    rack = serializers.CharField(source="rack.name", read_only=True)
    rack_id = serializers.IntegerField(read_only=True)
    moves = serializers.SerializerMethodField(
        help_text="The moves the node's state allows (POST /api/nodes/<id>/<move>/)."
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "rack_id",
            "rack",
            "slot",
            "hostname",
            "state",
            "state_reason",
            "state_changed_at",
            "last_heartbeat_at",
            "moves",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.ChoiceField(choices=list(MOVES))))
    def get_moves(self, obj: Node) -> list[str]:
        return moves_for(obj.state)


class NodeDetailSerializer(NodeSerializer):
    gpus = GPUCellSerializer(many=True, read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "gpus"]
        read_only_fields = fields


class CounterSerializer(serializers.Serializer):
    value = serializers.IntegerField(help_text="As NVML last gave it (cumulative).")
    resets = serializers.IntegerField(help_text="Times it went down (driver reload, reboot).")
    per_hour = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        help_text="Rise per hour over the last 10m, 1h and 24h, across resets (null: too little history).",
    )


class GpuReadingSerializer(serializers.Serializer):
    read_at = serializers.DateTimeField()
    temperature_c = serializers.FloatField(allow_null=True)
    signals = serializers.JSONField(help_text="What the agent read from NVML (README, 'The node agent').")
    unsupported = serializers.ListField(
        child=serializers.CharField(), help_text="Signals this GPU cannot give."
    )
    counters = serializers.DictField(child=CounterSerializer())
    samples = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="The last hour, one a minute: [epoch seconds, temperature C, power W].",
    )


class GpuSignalsSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    health = serializers.CharField()
    reading = GpuReadingSerializer(allow_null=True)


class RackFabricSerializer(serializers.Serializer):
    cluster_uuid = serializers.CharField(allow_null=True, help_text="Null: not known (see note).")
    clique_id = serializers.IntegerField(allow_null=True, help_text="Null: not known, or any clique.")
    source = serializers.CharField(
        help_text="external_id (the rack's recorded <ClusterUUID>.<CliqueId> or <ClusterUUID>), "
        "majority (more than half of its reporting nodes), or empty."
    )
    note = serializers.CharField(help_text="Why a part is not known (a tie, no majority).")


class FabricMismatchSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    hostname = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=["other_domain", "other_clique", "gpus_disagree"],
        help_text="other_domain: another cluster UUID than the rack's; other_clique: the rack's, "
        "another clique (a fabric partition apart); gpus_disagree: its GPUs report different fabrics.",
    )
    rack_id = serializers.IntegerField(help_text="The rack the node is recorded in.")
    rack = serializers.CharField()
    reported = serializers.ListField(
        child=serializers.CharField(), help_text="The fabrics its GPUs report, as <ClusterUUID>.<CliqueId>."
    )
    expected = RackFabricSerializer(help_text="The fabric its rack should have.")
    fabric_rack_id = serializers.IntegerField(
        allow_null=True, help_text="The rack whose fabric the node reports (null: none, or several)."
    )
    fabric_rack = serializers.CharField()
    text = serializers.CharField()


class NodeSignalsSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    imex = serializers.DictField(allow_null=True, help_text="The IMEX daemon's status and detail.")
    fabric = serializers.DictField(
        allow_null=True, help_text="The NVLink fabric's cluster UUID and clique id."
    )
    fabric_mismatch = FabricMismatchSerializer(
        allow_null=True,
        help_text="How the fabric its GPUs report disagrees with its rack's; null when it does not "
        "(or nothing recent was reported).",
    )
    gpus = GpuSignalsSerializer(many=True)


class GpusNamedSerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="GPU indices.")


class ClockEventSerializer(GpusNamedSerializer):
    reason = serializers.CharField()
    quiet = serializers.BooleanField(help_text="No news: an idle GPU, clocks an operator set.")


class FlagSetSerializer(GpusNamedSerializer):
    flag = serializers.CharField(help_text="e.g. remapped_rows.pending")


class RisingCounterSerializer(GpusNamedSerializer):
    counter = serializers.CharField(help_text="e.g. ecc.volatile_corrected, nvlink.crc_flit")
    per_hour = serializers.FloatField(help_text="Rise per hour of the GPUs together.")
    window = serializers.ChoiceField(
        choices=["1h", "10m"], help_text="Over the last hour; 10m while less than half an hour is seen."
    )


class NodeFabricSerializer(serializers.Serializer):
    imex_status = serializers.CharField()
    imex_detail = serializers.CharField()
    clique_id = serializers.IntegerField(allow_null=True)
    trouble = serializers.CharField(help_text="What this node reports wrong with its fabric ('' if nothing).")


class GpuVerdictSerializer(GpusNamedSerializer):
    verdict = serializers.CharField()
    reason = serializers.CharField(help_text="The reading that gave it, and the rule.")


class GpuUnwellSerializer(serializers.Serializer):
    gpu = serializers.IntegerField()
    health = serializers.CharField()
    error = serializers.CharField()


class HottestGpuSerializer(serializers.Serializer):
    gpu = serializers.IntegerField()
    temperature_c = serializers.FloatField()


class NodeAtAGlanceSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    slot = serializers.IntegerField()
    hostname = serializers.CharField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
    drained_by_rule = serializers.BooleanField(help_text="Draining or drained by a health rule's verdict.")
    read_at = serializers.DateTimeField(
        allow_null=True, help_text="Its latest reading; null: its agent sent no signals."
    )
    gpus_reporting = serializers.IntegerField()
    hottest = HottestGpuSerializer(allow_null=True)
    power_w = serializers.FloatField(allow_null=True, help_text="Its GPUs together.")
    clock_events = ClockEventSerializer(many=True)
    flags = FlagSetSerializer(many=True)
    rising = RisingCounterSerializer(many=True, help_text="Error counters that rose (non-zero rates only).")
    fabric = NodeFabricSerializer(allow_null=True)
    verdicts = GpuVerdictSerializer(
        many=True, help_text="Worst first; GPUs with the same verdict for the same reason together."
    )
    gpus_unwell = GpuUnwellSerializer(
        many=True, help_text="GPUs not ok without a verdict (an XID, the agent's word), and why."
    )
    samples = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="The last hour, one a minute: [epoch seconds, hottest GPU C, power W of its GPUs].",
    )


class RackSignalsSerializer(serializers.Serializer):
    rack_id = serializers.IntegerField()
    name = serializers.CharField()
    fabric_degraded = serializers.CharField(help_text="Why its NVLink fabric is degraded ('' if it is not).")
    verdicts = serializers.DictField(
        child=serializers.IntegerField(), help_text="GPUs per verdict in force (fail, drain, suspect)."
    )
    nodes = NodeAtAGlanceSerializer(many=True)


class RackDetailSerializer(RackSerializer):
    nodes = NodeDetailSerializer(many=True, read_only=True)

    class Meta(RackSerializer.Meta):
        fields = [*RackSerializer.Meta.fields, "nodes"]
        read_only_fields = fields


class ReasonSerializer(KnownFieldsOnly):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class NodeMoveSerializer(ReasonSerializer):
    """An operator's move on a node. Drain and mark-failed need a reason; on a
    node that holds jobs they also need ``confirm: true`` (without it, a 409
    names the jobs and the GPU-hours the move would cost)."""

    confirm = serializers.BooleanField(required=False, default=False)


class NodeImpactSerializer(serializers.Serializer):
    """A node move's 409: a move the node's state does not allow (``detail``
    only), or a disruptive one asked without ``confirm`` (with what it would
    interrupt)."""

    detail = serializers.CharField()
    confirm_required = serializers.BooleanField(required=False)
    impact = serializers.DictField(required=False)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor_name",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "message",
            "before",
            "after",
            "request_id",
        ]
        read_only_fields = fields


class FleetSummarySerializer(RackSummarySerializer):
    racks = serializers.IntegerField()
    utilization = serializers.FloatField()
    utilization_of_usable = serializers.FloatField()
    jobs_by_state = serializers.DictField(child=serializers.IntegerField())
    free_nodes_per_rack = serializers.ListField(child=serializers.DictField())


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(allow_null=True)
    tenants = serializers.ListField(child=serializers.CharField())


class AwaitingApprovalSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    oldest_id = serializers.IntegerField(allow_null=True)
    oldest_age_s = serializers.IntegerField()
    oldest_age = serializers.CharField(help_text="The oldest's age in words, e.g. '32 min'.")


class AttentionItemSerializer(serializers.Serializer):
    key = serializers.CharField()
    count = serializers.IntegerField()
    text = serializers.CharField()
    url = serializers.CharField(help_text="The console page to act on it.")


class AttentionSerializer(serializers.Serializer):
    awaiting_approval = AwaitingApprovalSerializer()
    jobs_recovering = serializers.IntegerField()
    jobs_waiting_long = serializers.IntegerField(
        help_text="Pending jobs that waited longer than wait_warn_s."
    )
    wait_warn_s = serializers.IntegerField()
    nodes = serializers.DictField(
        child=serializers.IntegerField(), help_text="Suspect, failed and in-repair nodes."
    )
    racks_degraded = serializers.IntegerField(help_text="Racks whose NVLink fabric is degraded.")
    fabric_mismatch = serializers.IntegerField(
        help_text="Nodes whose NVLink fabric (as their agents report it) disagrees with their rack's."
    )
    fabric_mismatches = FabricMismatchSerializer(many=True, help_text="Those nodes, the first 50.")
    items = AttentionItemSerializer(many=True, help_text="What needs a person, most urgent first.")


class RackFragmentationSerializer(serializers.Serializer):
    rack = serializers.CharField(help_text="The rack's name.")
    rack_id = serializers.IntegerField()
    free_gpus = serializers.IntegerField(help_text="Free GPUs of healthy nodes, spares included.")
    idle_nodes = serializers.IntegerField(help_text="Healthy nodes holding nothing.")
    spare_nodes = serializers.IntegerField(
        help_text="Idle nodes kept back for recovery (none once small or preemptible jobs borrow them); "
        "not counted."
    )
    slice_nodes = serializers.IntegerField(
        help_text="The rack's free slice: idle nodes it offers a non-preemptible gang, spares kept. "
        "The rack card's 'slice' on the Fleet page."
    )
    share_nodes = serializers.IntegerField(
        help_text="Nodes of the typical multi-node job this rack must offer to be of use to it."
    )
    fragmented_gpus = serializers.IntegerField(
        help_text="Free GPUs of partly used nodes, plus the free slice when it is smaller than share_nodes."
    )
    largest_job_gpus = serializers.IntegerField(help_text="slice_nodes in GPUs.")


class FragmentationSerializer(serializers.Serializer):
    """Fragmentation, one definition everywhere (console header, Fleet chart,
    /metrics; docs/fragmentation.md): the share of free GPUs, spares kept for
    recovery left out, that the typical multi-node job cannot use, because they
    sit on partly used nodes or in racks whose free slice is smaller than the
    job's share of a rack."""

    free_gpus = serializers.IntegerField(help_text="Free GPUs of healthy nodes, spares included.")
    spare_gpus = serializers.IntegerField(help_text="GPUs of the idle spare nodes racks keep for recovery.")
    counted_gpus = serializers.IntegerField(
        help_text="free_gpus less spare_gpus: the fraction's denominator."
    )
    fragmented_gpus = serializers.IntegerField(
        help_text="Counted GPUs the typical multi-node job cannot use: those of partly used nodes (a gang "
        "takes whole nodes) and every free slice smaller than the job's share of its rack."
    )
    fraction = serializers.FloatField(
        help_text="Fragmentation, 0..1: fragmented_gpus / counted_gpus (0 when nothing is counted, so 0 on "
        "an idle fleet and on a full one). The console header's and the Fleet chart's figure, and "
        "rackwise_fragmentation in /metrics."
    )
    largest_slice_nodes = serializers.IntegerField(
        help_text="The largest free slice of one rack: idle nodes offered to a non-preemptible gang, spares "
        "kept (the best rack card's 'slice')."
    )
    largest_job_gpus = serializers.IntegerField(
        help_text="The largest rack-local gang placeable now without touching spares: "
        "largest_slice_nodes in GPUs."
    )
    typical_job_gpus = serializers.IntegerField(
        help_text="GPUs of the typical multi-node job: the median of the pending jobs and those submitted in "
        "the last day that take more than one node, else 64 (a 16-node NVL72 slice)."
    )
    typical_segment_nodes = serializers.IntegerField(allow_null=True, help_text="Its segment size, if any.")
    typical_from = serializers.ChoiceField(
        choices=["jobs", "default"],
        help_text="'jobs' (the median of those jobs) or 'default' (none took more than one node).",
    )
    racks = RackFragmentationSerializer(many=True)
