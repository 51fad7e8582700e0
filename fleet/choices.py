"""Enumerations shared by models, services, API and templates."""

from django.db import models


class RackKind(models.TextChoices):
    NVL72 = "NVL72", "NVL72 (18 nodes x 4 GPUs)"
    NVL36 = "NVL36", "NVL36 half of an NVL36x2 (9 nodes x 4 GPUs)"
    HGX8 = "HGX8", "HGX 8-GPU node (1 node x 8 GPUs)"
    CUSTOM = "CUSTOM", "Custom shape"


# Default shape for each kind: (nodes per NVLink domain, GPUs per node, spare nodes).
# Shapes are data on each Rack row; these only pre-fill new racks.
RACK_KIND_DEFAULTS: dict[str, tuple[int, int, int]] = {
    RackKind.NVL72: (18, 4, 2),
    RackKind.NVL36: (9, 4, 1),
    RackKind.HGX8: (1, 8, 0),
}


class NodeState(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    SUSPECT = "suspect", "Suspect"
    FAILED = "failed", "Failed"
    DRAINING = "draining", "Draining"
    DRAINED = "drained", "Drained"
    IN_REPAIR = "in_repair", "In repair"


# Nodes in these states accept new work.
SCHEDULABLE_NODE_STATES = (NodeState.HEALTHY,)
# Nodes in these states count as failed capacity.
FAILED_NODE_STATES = (NodeState.FAILED, NodeState.IN_REPAIR)


class GpuHealth(models.TextChoices):
    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    PLACED = "placed", "Placed"
    RUNNING = "running", "Running"
    RECOVERING = "recovering", "Recovering"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_JOB_STATES = (JobState.PENDING, JobState.PLACED, JobState.RUNNING, JobState.RECOVERING)
FINISHED_JOB_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
# Jobs in these states hold GPUs.
HOLDING_JOB_STATES = (JobState.PLACED, JobState.RUNNING, JobState.RECOVERING)


class Locality(models.TextChoices):
    REQUIRED = "required", "Required: wait rather than span racks"
    PREFERRED = "preferred", "Preferred: span racks only when it cannot fit in one"
    NONE = "none", "None: topology-blind"


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    SUBMITTER = "submitter", "Submitter"
    OPERATOR = "operator", "Operator"


class ActionKind(models.TextChoices):
    PLACEMENT = "placement", "Placement that keeps locality"
    PLACEMENT_SPILL = "placement_spill", "Placement that spans racks (preferred job)"
    RECOVERY = "recovery", "In-place recovery (swap failed nodes for spares)"
    PREEMPTION = "preemption", "Recovery that preempts lower-priority jobs"
    MIGRATION = "migration", "Recovery that moves the whole job"
    REQUEUE = "requeue", "Recovery that requeues the job"
    DEFRAG = "defrag", "Defragmentation plan"
    RECLAIM = "reclaim", "Preemption to start a job (quota reclaim, or a higher priority)"
    DRAIN = "drain", "Drain a node"
    EVACUATION = "evacuation", "Move a job off a degraded rack or a node about to fail"


class ActionState(models.TextChoices):
    PROPOSED = "proposed", "Proposed"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    EXECUTING = "executing", "Executing"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


OPEN_ACTION_STATES = (ActionState.PROPOSED, ActionState.APPROVED, ActionState.EXECUTING)


class ApprovalMode(models.TextChoices):
    AUTO = "auto", "Automatic"
    MANUAL = "manual", "Operator approval"


# Kinds that run without an operator unless the policy says otherwise.
DEFAULT_APPROVAL: dict[str, str] = {
    ActionKind.PLACEMENT: ApprovalMode.AUTO,
    ActionKind.PLACEMENT_SPILL: ApprovalMode.MANUAL,
    ActionKind.RECOVERY: ApprovalMode.AUTO,
    ActionKind.PREEMPTION: ApprovalMode.MANUAL,
    ActionKind.MIGRATION: ApprovalMode.MANUAL,
    ActionKind.REQUEUE: ApprovalMode.AUTO,
    ActionKind.DEFRAG: ApprovalMode.MANUAL,
    # Above RACKWISE_RECLAIM_APPROVAL_GPU_HOURS a reclaim waits for an operator.
    ActionKind.RECLAIM: ApprovalMode.AUTO,
    ActionKind.DRAIN: ApprovalMode.MANUAL,
    ActionKind.EVACUATION: ApprovalMode.MANUAL,
}


class WebhookEvent(models.TextChoices):
    """Events operators can subscribe a webhook endpoint to."""

    JOB_PLACED = "job.placed", "A job was bound to GPUs"
    NODE_FAILED = "node.failed", "A node failed (operator, fatal XID or silence)"
    ACTION_PROPOSED = "action.proposed", "A decision was recorded"
    ACTION_APPROVED = "action.approved", "A decision was approved (by an operator or the policy)"
    ACTION_FINISHED = "action.finished", "A decision ended: succeeded, failed, cancelled, expired or rejected"
    RECLAIM_PROPOSED = "reclaim.proposed", "A job is to start by preempting others (borrowed GPUs taken back)"
    RECLAIM_FINISHED = "reclaim.finished", "A reclaim ended: succeeded, failed, cancelled, expired, rejected"
    GPU_VERDICT = "gpu.verdict", "A health rule gave a GPU a verdict (fail, drain, suspect), with the reading"
    RACK_FABRIC = "rack.fabric", "A rack's NVLink fabric became degraded, or healthy again"


# Sent by the "test" button only; not subscribable.
WEBHOOK_PING = "ping"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    RETRYING = "retrying", "Failed, will retry"
    SUCCEEDED = "succeeded", "Succeeded"
    DEAD = "dead", "Dead (gave up)"


# Deliveries in these states still have attempts to make.
OPEN_DELIVERY_STATES = (DeliveryState.PENDING, DeliveryState.RETRYING)


class Verdict(models.TextChoices):
    """What a health rule makes of a GPU (fleet.gpu_verdicts), worst first."""

    FAIL = "fail", "Fail now"
    DRAIN = "drain", "Drain after its job"
    SUSPECT = "suspect", "Suspect"


class RuleTest(models.TextChoices):
    RATE_ABOVE = "rate_above", "rises faster than (per hour, over the window)"
    ABOVE = "above", "is above"
    SET = "set", "is set"
